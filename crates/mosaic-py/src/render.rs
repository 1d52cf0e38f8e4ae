//! A plan as text (`str(plan)`). The `mosaic plan` table lives in the binary (mosaic-cli's
//! `render.rs`), out of a library's reach; this is the same information, written here.

use std::fmt::Write;

use mosaic_plan::Plan;

/// GPU indices as compact ranges: `0-3,6`.
fn gpu_ranges(gpus: &[u32]) -> String {
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
        let _ = match j - i {
            0 => write!(out, "{}", gpus[i]),
            1 => write!(out, "{},{}", gpus[i], gpus[j]),
            _ => write!(out, "{}-{}", gpus[i], gpus[j]),
        };
        i = j + 1;
    }
    out
}

/// What is proven about the plan, in words.
fn proof(plan: &Plan) -> String {
    match plan.lower_bound_ms {
        _ if plan.optimal => "proven optimal".into(),
        Some(b) if b > 0.0 => format!(
            "within {:.1} % of the optimum (lower bound {b:.1} ms)",
            100.0 * (plan.iteration_ms / b - 1.0)
        ),
        _ => "no bound proven".into(),
    }
}

/// The plan as a table: a header, then per stage its time and per module its dp, quota,
/// GPUs, times and memory.
pub(crate) fn plan_text(plan: &Plan, label: &str) -> String {
    let mut s = String::new();
    let search = match plan.search.as_str() {
        "gahc" => "GAHC (the paper's Alg. 1)",
        "local" => "GAHC, then local moves and re-cut orders",
        "exact" => "the exact down-set search",
        other => other,
    };
    let _ = writeln!(
        s,
        "{label}: {} × {}, SM quota step {}\nfound by {search}; solved in {:.1} ms\n\
         predicted iteration: {:.1} ms in {} stage(s), {}",
        plan.gpus,
        plan.device,
        plan.granularity,
        plan.solve_ms,
        plan.iteration_ms,
        plan.stages.len(),
        proof(plan)
    );
    let w = plan
        .stages
        .iter()
        .flat_map(|st| st.modules.iter().map(|m| m.name.chars().count()))
        .max()
        .unwrap_or(6)
        .max(6);
    for (i, st) in plan.stages.iter().enumerate() {
        let used: f64 = st.gpu_quota.iter().sum();
        let _ = writeln!(
            s,
            "\nstage {} · {:.1} ms · SM quota used {:.0}% of the pool",
            i + 1,
            st.time_ms,
            100.0 * used / f64::from(plan.gpus.max(1))
        );
        let _ = writeln!(
            s,
            "  {:<w$}  {:>3}  {:>5}  {:<12}  {:>10}  {:>10}  {:>8}",
            "module", "dp", "quota", "GPUs", "time ms", "alone ms", "mem GiB"
        );
        for m in &st.modules {
            let pad = w - m.name.chars().count().min(w);
            let _ = writeln!(
                s,
                "  {}{:pad$}  {:>3}  {:>5.2}  {:<12}  {:>10.1}  {:>10.1}  {:>8.1}",
                m.name,
                "",
                m.dp,
                m.sm,
                gpu_ranges(&m.gpus),
                m.time_ms,
                m.base_ms,
                m.mem_gib
            );
        }
    }
    s
}
