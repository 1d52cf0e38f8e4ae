//! Human-readable tables.

use std::fmt::Write;

use mosaic_plan::Plan;

/// GPU indices as compact ranges: `0-3,6`.
pub fn gpu_ranges(gpus: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < gpus.len() {
        let mut j = i;
        while j + 1 < gpus.len() && gpus[j + 1] == gpus[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        match j - i {
            0 => write!(out, "{}", gpus[i]),
            1 => write!(out, "{},{}", gpus[i], gpus[j]),
            _ => write!(out, "{}-{}", gpus[i], gpus[j]),
        }
        .expect("writing to a String");
        i = j + 1;
    }
    out
}

/// The plan as a table: per stage its time and quota use, per module dp, quota, GPUs, times.
pub fn plan_table(plan: &Plan, label: &str, auto: bool) -> String {
    let mut s = String::new();
    let search = match (plan.search.as_str(), auto) {
        ("exact", _) => "exact (proven optimal)".to_string(),
        ("gahc", true) => "gahc (the exact search did not finish within the budget)".to_string(),
        (other, _) => other.to_string(),
    };
    let _ = writeln!(
        s,
        "{label}: {} × {}, SM quota step {}\nsearch: {search}, solved in {:.1} ms\n\
         predicted iteration: {:.1} ms in {} stage(s)\n",
        plan.gpus,
        plan.device,
        plan.granularity,
        plan.solve_ms,
        plan.iteration_ms,
        plan.stages.len()
    );
    let name_w = plan
        .stages
        .iter()
        .flat_map(|st| st.modules.iter().map(|m| m.name.len()))
        .max()
        .unwrap_or(6)
        .max(6);
    for (i, st) in plan.stages.iter().enumerate() {
        let used: f64 = st.gpu_quota.iter().sum();
        let _ = writeln!(
            s,
            "stage {} · {:.1} ms · SM quota used {:.0}% of the pool",
            i + 1,
            st.time_ms,
            100.0 * used / plan.gpus as f64
        );
        let _ = writeln!(
            s,
            "  {:<name_w$}  {:>3}  {:>5}  {:<12}  {:>10}  {:>10}  {:>8}",
            "module", "dp", "quota", "GPUs", "time ms", "alone ms", "mem GiB"
        );
        for m in &st.modules {
            let _ = writeln!(
                s,
                "  {:<name_w$}  {:>3}  {:>5.2}  {:<12}  {:>10.1}  {:>10.1}  {:>8.1}",
                m.name,
                m.dp,
                m.sm,
                gpu_ranges(&m.gpus),
                m.time_ms,
                m.base_ms,
                m.mem_gib
            );
        }
        let quotas: Vec<String> = st.gpu_quota.iter().map(|q| format!("{q:.1}")).collect();
        let _ = writeln!(s, "  quota per GPU: {}\n", quotas.join(" "));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::gpu_ranges;

    #[test]
    fn ranges_are_compact() {
        assert_eq!(gpu_ranges(&[0, 1, 2, 3, 6]), "0-3,6");
        assert_eq!(gpu_ranges(&[4, 5]), "4,5");
        assert_eq!(gpu_ranges(&[]), "");
    }
}
