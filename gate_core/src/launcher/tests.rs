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
