//! What the planner's property-test files share.

use proptest::prelude::ProptestConfig;

/// `default` cases, or `PROPTEST_CASES` when set (for a long bug hunt); failures print the
/// shrunk input and write no regression file. Some generated models are rejected (a module
/// without any option), about one in seven, so the reject limit grows with the case count.
pub fn config(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    ProptestConfig {
        cases,
        max_global_rejects: cases.max(1024),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}
