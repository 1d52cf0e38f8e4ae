//! A picture of the simulated plan in the style of the paper's Figs. 3–4: GPUs as rows, time
//! as columns, each module a block as tall as its SM quota, stacked inside its GPU's row.

use std::fmt::Write;

use crate::report::{Phase, SimReport};

/// Colours of the first modules (Tableau 10 without its grey, and matplotlib's extras); later
/// ones by the golden angle. No grey: the rows' background is grey.
const PALETTE: [&str; 12] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#17becf", "#bcbd22", "#8c564b",
];

fn colour(i: usize) -> String {
    match PALETTE.get(i) {
        Some(c) => c.to_string(),
        None => format!("hsl({:.0}, 55%, 55%)", (i as f64 * 137.508) % 360.0),
    }
}

/// Escapes text for XML content and attributes.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

/// A round tick step giving about `target` ticks over `span`: 1, 2 or 5 × 10^k.
fn tick_step(span: f64, target: f64) -> f64 {
    if span <= 0.0 {
        return 1.0;
    }
    let raw = span / target;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * mag)
}

/// A standalone SVG document of the report: one row per GPU (block height = SM quota, the
/// modules of a stage stacked in plan order), compute blocks solid and gradient all-reduces
/// hatched in their module's colour, stage boundaries as dashed lines, a millisecond axis, a
/// legend and a title with the simulated and predicted iteration times. Every block carries a
/// `<title>` tooltip with its numbers.
pub fn svg(report: &SimReport) -> String {
    let gpus = report.gpus.max(1) as f64;
    let width = 1200.0;
    let (left, right) = (70.0, 20.0);
    let plot_w = width - left - right;
    let row_h = (900.0 / gpus).clamp(12.0, 44.0);
    let gap = (row_h * 0.15).clamp(2.0, 6.0);
    let top = 78.0;
    let plot_h = gpus * (row_h + gap);
    let span = report.iteration_ms.max(1e-9);
    let x = |ms: f64| left + ms / span * plot_w;

    // Modules in plan order (stage by stage), then any other module a slice names.
    let mut modules: Vec<&str> = Vec::new();
    let names = report
        .stages
        .iter()
        .flat_map(|st| st.modules.iter().map(|m| m.name.as_str()))
        .chain(report.slices.iter().map(|s| s.module.as_str()));
    for name in names {
        if !modules.contains(&name) {
            modules.push(name);
        }
    }
    let colour_of = |m: &str| colour(modules.iter().position(|&x| x == m).unwrap_or(0));

    let legend_cols = 6usize;
    let legend_rows = (modules.len() + 1).div_ceil(legend_cols);
    let axis_y = top + plot_h + 4.0;
    let legend_y = axis_y + 40.0;
    let height = legend_y + legend_rows as f64 * 20.0 + 10.0;

    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(
        w,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:.0}" viewBox="0 0 {width} {height:.0}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        w,
        r#"<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="white" fill-opacity="0.55"/><line x1="0" y1="0" x2="0" y2="6" stroke="black" stroke-opacity="0.35" stroke-width="2"/></pattern></defs>"#
    );
    let _ = writeln!(
        w,
        r#"<rect x="0" y="0" width="{width}" height="{height:.0}" fill="white"/>"#
    );
    let sign = if report.prediction_error >= 0.0 {
        "+"
    } else {
        ""
    };
    let _ = writeln!(
        w,
        r#"<text x="{left}" y="22" font-size="16" font-weight="bold">{} on {}: simulated iteration {:.1} ms (plan predicted {:.1} ms, {sign}{:.1}%)</text>"#,
        esc(&report.model),
        esc(&report.cluster),
        report.iteration_ms,
        report.predicted_ms,
        100.0 * report.prediction_error
    );
    let _ = writeln!(
        w,
        r##"<text x="{left}" y="40" fill="#555">{} × {} · block height = SM quota · hatched = gradient all-reduce · mean GPU utilisation {:.0}% (occupancy {:.0}%)</text>"##,
        report.gpus,
        esc(&report.device),
        100.0 * report.mean_utilisation,
        100.0 * report.mean_occupancy
    );

    // Rows.
    let font = (row_h * 0.7).clamp(8.0, 12.0);
    for g in 0..report.gpus {
        let y = top + g as f64 * (row_h + gap);
        let _ = writeln!(
            w,
            r##"<rect x="{left}" y="{y:.2}" width="{plot_w}" height="{row_h:.2}" fill="#f2f2f2"/>"##
        );
        let _ = writeln!(
            w,
            r#"<text x="{:.1}" y="{:.2}" text-anchor="end" font-size="{font:.0}">GPU {g}</text>"#,
            left - 6.0,
            y + row_h / 2.0 + font * 0.35
        );
    }
    // Node separators.
    let gpn = report.gpus_per_node.max(1);
    for n in 1..report.gpus.div_ceil(gpn) {
        let y = top + (n * gpn) as f64 * (row_h + gap) - gap / 2.0;
        let _ = writeln!(
            w,
            r##"<line x1="{:.1}" y1="{y:.2}" x2="{:.1}" y2="{y:.2}" stroke="#888" stroke-width="1"/>"##,
            left - 60.0,
            width - right
        );
    }

    // Blocks.
    for sl in &drawing_order(report) {
        let y0 = top + sl.gpu as f64 * (row_h + gap) + sl.offset * row_h;
        let h = (sl.quota * row_h).max(0.5);
        let (x0, x1) = (x(sl.start_ms), x(sl.end_ms));
        let bw = (x1 - x0).max(0.5);
        let c = colour_of(&sl.module);
        let tip = format!(
            "{} · GPU {} · stage {} · {} {:.2}–{:.2} ms ({:.2} ms) · quota {:.2}",
            sl.module,
            sl.gpu,
            sl.stage + 1,
            sl.phase.as_str(),
            sl.start_ms,
            sl.end_ms,
            sl.end_ms - sl.start_ms,
            sl.quota
        );
        let _ = write!(w, r#"<g><title>{}</title>"#, esc(&tip));
        match sl.phase {
            Phase::Compute => {
                let _ = write!(
                    w,
                    r#"<rect x="{x0:.2}" y="{y0:.2}" width="{bw:.2}" height="{h:.2}" fill="{c}" stroke="white" stroke-width="0.6"/>"#
                );
            }
            Phase::Allreduce => {
                let _ = write!(
                    w,
                    r#"<rect x="{x0:.2}" y="{y0:.2}" width="{bw:.2}" height="{h:.2}" fill="{c}" stroke="white" stroke-width="0.6"/><rect x="{x0:.2}" y="{y0:.2}" width="{bw:.2}" height="{h:.2}" fill="url(#hatch)"/>"#
                );
            }
        }
        let font = (h - 2.0).min(11.0);
        let text_w = sl.module.chars().count() as f64 * font * 0.6 + 4.0;
        if sl.phase == Phase::Compute && font >= 7.0 && text_w <= bw {
            let _ = write!(
                w,
                r#"<text x="{:.2}" y="{:.2}" font-size="{font:.1}" fill="white">{}</text>"#,
                x0 + 3.0,
                y0 + h / 2.0 + font * 0.35,
                esc(&sl.module)
            );
        }
        let _ = writeln!(w, "</g>");
    }

    // Stage boundaries and labels.
    for st in &report.stages {
        let xs = x(st.start_ms);
        let xe = x(st.start_ms + st.time_ms);
        let _ = writeln!(
            w,
            r##"<line x1="{xs:.2}" y1="{:.1}" x2="{xs:.2}" y2="{:.1}" stroke="#333" stroke-width="1" stroke-dasharray="4 3"/>"##,
            top - 16.0,
            top + plot_h
        );
        let label = format!("stage {} · {:.1} ms", st.index + 1, st.time_ms);
        let fits = label.chars().count() as f64 * 6.6 <= (xe - xs - 4.0);
        let short = format!("{}", st.index + 1);
        let _ = writeln!(
            w,
            r##"<text x="{:.2}" y="{:.1}" fill="#333">{}</text>"##,
            xs + 3.0,
            top - 6.0,
            if fits { esc(&label) } else { short }
        );
    }
    let _ = writeln!(
        w,
        r##"<line x1="{:.2}" y1="{:.1}" x2="{:.2}" y2="{:.1}" stroke="#333" stroke-width="1" stroke-dasharray="4 3"/>"##,
        x(span),
        top - 16.0,
        x(span),
        top + plot_h
    );

    // Axis.
    let _ = writeln!(
        w,
        r##"<line x1="{left}" y1="{axis_y:.1}" x2="{:.1}" y2="{axis_y:.1}" stroke="#333"/>"##,
        left + plot_w
    );
    let step = tick_step(span, 10.0);
    let mut k = 0;
    loop {
        let t = k as f64 * step;
        if t > span * (1.0 + 1e-9) {
            break;
        }
        let xt = x(t);
        let label = if step >= 1.0 {
            format!("{t:.0}")
        } else {
            format!("{t:.*}", (-step.log10().floor()) as usize)
        };
        let _ = writeln!(
            w,
            r##"<line x1="{xt:.2}" y1="{axis_y:.1}" x2="{xt:.2}" y2="{:.1}" stroke="#333"/><text x="{xt:.2}" y="{:.1}" text-anchor="middle">{label}</text>"##,
            axis_y + 5.0,
            axis_y + 18.0
        );
        k += 1;
    }
    let _ = writeln!(
        w,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">time (ms)</text>"##,
        left + plot_w,
        axis_y + 32.0
    );

    // Legend.
    let col_w = plot_w / legend_cols as f64;
    let mut entries: Vec<(String, String, bool)> = modules
        .iter()
        .map(|m| (m.to_string(), colour_of(m), false))
        .collect();
    entries.push(("gradient all-reduce".into(), "#888888".into(), true));
    for (i, (name, c, hatched)) in entries.iter().enumerate() {
        let lx = left + (i % legend_cols) as f64 * col_w;
        let ly = legend_y + (i / legend_cols) as f64 * 20.0;
        let _ = write!(
            w,
            r#"<rect x="{lx:.1}" y="{:.1}" width="14" height="12" fill="{c}"/>"#,
            ly - 10.0
        );
        if *hatched {
            let _ = write!(
                w,
                r#"<rect x="{lx:.1}" y="{:.1}" width="14" height="12" fill="url(#hatch)"/>"#,
                ly - 10.0
            );
        }
        let _ = writeln!(
            w,
            r#"<text x="{:.1}" y="{ly:.1}">{}</text>"#,
            lx + 19.0,
            esc(name)
        );
    }
    let _ = writeln!(w, "</svg>");
    s
}

/// The slices, compute first so that text on blocks is not hidden by later all-reduces.
fn drawing_order(report: &SimReport) -> Vec<&crate::report::Slice> {
    let mut v: Vec<_> = report.slices.iter().collect();
    v.sort_by_key(|s| s.phase == Phase::Allreduce);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        for (span, want) in [(114.5, 20.0), (26.8, 5.0), (9.0, 1.0), (0.3, 0.05)] {
            assert!((tick_step(span, 10.0) - want).abs() < 1e-9 * want, "{span}");
        }
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(esc("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
