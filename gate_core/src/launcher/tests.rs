use super::Step;

#[test]
fn step_codes_round_trip() {
    for code in 0..=u8::MAX {
        if let Some(step) = Step::from_code(code) {
            assert_eq!(step as u8, code);
        }
    }
    assert_eq!(Step::from_code(Step::Setns as u8), Some(Step::Setns));
    assert_eq!(Step::from_code(0), None);
}

#[test]
fn baseline_filters_build_for_both_modes_within_the_bpf_limit() {
    use super::seccomp::{build, Mode};
    for mode in [Mode::Nsjail, Mode::Direct] {
        let filters = build(mode).expect("filters build");
        assert_eq!(filters.len(), 3, "{mode:?}: one filter per errno");
        // BPF_MAXINSNS (linux/bpf_common.h); seccompiler refuses longer ones, this keeps a margin.
        assert!(filters.iter().all(|f| !f.is_empty() && f.len() < 4096), "{mode:?}");
    }
}
