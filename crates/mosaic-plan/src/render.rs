//! A plan as a human-readable table (what `mosaic plan` prints and Python's `str(plan)`).

use std::fmt::Write;

use crate::Plan;

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

/// The plan as a table: per stage its time and quota use, per module dp, quota (whole SMs on a
/// device with a partition rule), GPUs and times.
pub fn plan_table(plan: &Plan, label: &str) -> String {
    let mut s = String::new();
    let search = match plan.search.as_str() {
        "gahc" => "GAHC (the paper's Alg. 1)",
        "local" => "GAHC, then local moves and re-cut orders",
        "exact" => "the exact down-set search",
        other => other,
    };
    let proof = match plan.lower_bound_ms {
        _ if plan.optimal => "proven optimal".to_string(),
        Some(b) if b > 0.0 => format!(
            "within {:.1} % of the optimum (lower bound {b:.1} ms)",
            100.0 * (plan.iteration_ms / b - 1.0)
        ),
        _ => "no bound proven".to_string(),
    };
    let step = quota_grid(plan.granularity, plan.sm_count);
    let _ = writeln!(
        s,
        "{label}: {} × {}, {step}\nfound by {search}; solved in {:.1} ms\n\
         predicted iteration: {:.1} ms in {} stage(s), {proof}\n",
        plan.gpus,
        plan.device,
        plan.solve_ms,
        plan.iteration_ms,
        plan.stages.len()
    );
    let unit = match plan.sm_count {
        Some(_) => "SMs",
        None => "quota",
    };
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
            "module", "dp", unit, "GPUs", "time ms", "alone ms", "mem GiB"
        );
        for m in &st.modules {
            let _ = writeln!(
                s,
                "  {:<name_w$}  {:>3}  {:>5}  {:<12}  {:>10.1}  {:>10.1}  {:>8.1}",
                m.name,
                m.dp,
                quota(m.sm, plan.sm_count, 2),
                gpu_ranges(&m.gpus),
                m.time_ms,
                m.base_ms,
                m.mem_gib
            );
        }
        let _ = writeln!(
            s,
            "  {unit} per GPU: {}\n",
            quota_runs(&st.gpu_quota, plan.sm_count)
        );
    }
    s
}

/// The quota grid in words: `132 SMs each, quotas in 8-SM partitions` on a device of
/// `sm_count` SMs with a partition rule (`granularity` = step / SMs), else `SM quota step 0.1`.
pub fn quota_grid(granularity: f64, sm_count: Option<u32>) -> String {
    match sm_count {
        Some(n) => format!(
            "{n} SMs each, quotas in {}-SM partitions",
            (granularity * n as f64).round()
        ),
        None => format!("SM quota step {granularity}"),
    }
}

/// A quota as shown: whole SMs on a device of `sm_count` SMs, else the fraction of a GPU to
/// `digits` decimals.
fn quota(q: f64, sm_count: Option<u32>, digits: usize) -> String {
    match sm_count {
        Some(n) => format!("{}", (q * n as f64).round()),
        None => format!("{q:.digits$}"),
    }
}

/// Quotas per GPU ([`quota`] to one decimal), runs of equal ones written once with their
/// length: `1.0 0.6×3 0.0`, or `104×4 40×4` in SMs.
fn quota_runs(quotas: &[f64], sm_count: Option<u32>) -> String {
    let shown: Vec<String> = quotas.iter().map(|&q| quota(q, sm_count, 1)).collect();
    let mut out: Vec<String> = Vec::new();
    for run in shown.chunk_by(|a, b| a == b) {
        out.push(match run.len() {
            1 => run[0].clone(),
            n => format!("{}×{n}", run[0]),
        });
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::{gpu_ranges, quota_runs};

    #[test]
    fn quota_runs_are_compressed() {
        assert_eq!(
            quota_runs(&[1.0, 0.6, 0.6, 0.6, 0.0], None),
            "1.0 0.6×3 0.0"
        );
        assert_eq!(quota_runs(&[], None), "");
        let h100 = |sms: f64| sms / 132.0;
        assert_eq!(
            quota_runs(&[h100(104.0), h100(104.0), 1.0, 0.0], Some(132)),
            "104×2 132 0"
        );
    }

    #[test]
    fn ranges_are_compact() {
        assert_eq!(gpu_ranges(&[0, 1, 2, 3, 6]), "0-3,6");
        assert_eq!(gpu_ranges(&[4, 5]), "4,5");
        assert_eq!(gpu_ranges(&[]), "");
    }
}
