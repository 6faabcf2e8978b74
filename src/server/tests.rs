use super::*;

#[test]
fn the_cap_fits_the_descriptor_limit() {
    assert_eq!(connection_cap(4096, Some(1024)), 480);
    assert_eq!(connection_cap(100, Some(1 << 20)), 100);
    assert_eq!(connection_cap(100, None), 100);
    assert_eq!(connection_cap(100, Some(10)), 1);
}

#[test]
fn accept_backoff_grows_to_a_second_and_resets() {
    let mut backoff = AcceptBackoff::default();
    let first = backoff.next();
    let mut last = first;
    for _ in 0..20 {
        last = backoff.next();
    }
    assert!(first < last && last == Duration::from_secs(1));
    backoff.reset();
    assert_eq!(backoff.next(), first);
}
