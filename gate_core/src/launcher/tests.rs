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

#[test]
fn landlock_ruleset_follows_the_abi_and_the_mode() {
    use super::landlock::{ruleset_for, ACCESS_FS_MAKE_BLOCK, SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL};
    use super::seccomp::Mode;
    let scopes = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL;
    for mode in [Mode::Nsjail, Mode::Direct] {
        assert_eq!(ruleset_for(None, mode), None, "{mode:?}: no Landlock, no ruleset");
        for abi in [6, 7, 9] {
            let attr = ruleset_for(Some(abi), mode).expect("a ruleset from ABI 6");
            assert_eq!((attr.handled_access_fs, attr.handled_access_net, attr.scoped), (0, 0, scopes), "{mode:?} {abi}");
        }
    }
    for abi in 1..=5 {
        let attr = ruleset_for(Some(abi), Mode::Direct).expect("--jail none: a ruleset from ABI 1");
        assert_eq!((attr.handled_access_fs, attr.scoped), (ACCESS_FS_MAKE_BLOCK, 0), "{abi}");
        assert_eq!(ruleset_for(Some(abi), Mode::Nsjail), None, "nsjail must keep its mounts: {abi}");
    }
}

#[test]
fn the_kernel_accepts_every_ruleset_the_launcher_can_ask_for() {
    use super::landlock::{abi, create, ruleset_for};
    use super::seccomp::Mode;
    let Some(running) = abi() else {
        eprintln!("no Landlock on this kernel: nothing to create");
        return;
    };
    for probe in 1..=running {
        for mode in [Mode::Nsjail, Mode::Direct] {
            if let Some(attr) = ruleset_for(Some(probe), mode) {
                create(&attr).unwrap_or_else(|e| panic!("ABI {probe} {mode:?}: {attr:?}: {e}"));
            }
        }
    }
    let empty = super::landlock::RulesetAttr { handled_access_fs: 0, handled_access_net: 0, scoped: 0 };
    assert_eq!(create(&empty).map(drop).map_err(|e| e.raw_os_error()), Err(Some(libc::ENOMSG)),
               "an empty ruleset is refused (landlock_create_ruleset(2))");
}
