use super::*;

fn fallback(kind: OutcomeKind, tokens_after: u64) -> Fallback {
    Fallback {
        kind,
        body: Vec::new(),
        summary: None,
        covered: Vec::new(),
        tokens_after,
        dropped: 0,
        headroom_unmet: false,
    }
}

#[test]
fn the_first_fallback_that_fits_is_chosen_else_the_smallest() {
    let kinds = |window| {
        let all = vec![
            fallback(OutcomeKind::Reused, 900),
            fallback(OutcomeKind::Cleared, 1_200),
            fallback(OutcomeKind::Truncated, 700),
        ];
        Fallback::choose(all, window).map(|f| f.kind)
    };
    // The cached summary keeps the most, and fits.
    assert_eq!(kinds(Some(1_000)), Some(OutcomeKind::Reused));
    assert_eq!(kinds(None), Some(OutcomeKind::Reused));
    // Only truncation fits.
    assert_eq!(kinds(Some(800)), Some(OutcomeKind::Truncated));
    // Nothing fits: the smallest is the least likely to be refused.
    assert_eq!(kinds(Some(100)), Some(OutcomeKind::Truncated));
    assert!(Fallback::choose(Vec::new(), Some(100)).is_none());
}
