//! A picture of the simulated plan in the style of the paper's Figs. 3–4: GPUs as rows, time
//! as columns, each module a block as tall as its SM quota, stacked inside its GPU's row.

use mosaic_kit::svg::{round_step, Svg};

use crate::report::{Phase, SimReport, Slice};

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

/// A round tick step giving about `target` ticks over `span`: 1, 2 or 5 × 10^k.
fn tick_step(span: f64, target: f64) -> f64 {
    if span <= 0.0 {
        return 1.0;
    }
    round_step(span / target, &[1.0, 2.0, 5.0])
}

/// Legend entries per line.
const LEGEND_COLS: usize = 6;

/// Where things go, in pixels: GPU rows of the plot, the time axis and legend below them.
struct Layout {
    width: f64,
    height: f64,
    /// Left and right margins of the plot.
    left: f64,
    right: f64,
    /// Top of the first row, width and height of the rows together.
    top: f64,
    plot_w: f64,
    plot_h: f64,
    /// Height of a row (a whole GPU) and the gap below it.
    row_h: f64,
    gap: f64,
    /// Milliseconds the plot's width stands for.
    span: f64,
    axis_y: f64,
    legend_y: f64,
}

impl Layout {
    /// The layout of `report` with `modules` legend entries besides the all-reduce's.
    fn new(report: &SimReport, modules: usize) -> Layout {
        let gpus = report.gpus.max(1) as f64;
        let width = 1200.0;
        let (left, right) = (70.0, 20.0);
        let row_h = (900.0 / gpus).clamp(12.0, 44.0);
        let gap = (row_h * 0.15).clamp(2.0, 6.0);
        let top = 78.0;
        let plot_h = gpus * (row_h + gap);
        let legend_rows = (modules + 1).div_ceil(LEGEND_COLS);
        let axis_y = top + plot_h + 4.0;
        let legend_y = axis_y + 40.0;
        Layout {
            width,
            height: legend_y + legend_rows as f64 * 20.0 + 10.0,
            left,
            right,
            top,
            plot_w: width - left - right,
            plot_h,
            row_h,
            gap,
            span: report.iteration_ms.max(1e-9),
            axis_y,
            legend_y,
        }
    }

    /// The x of time `ms`.
    fn x(&self, ms: f64) -> f64 {
        self.left + ms / self.span * self.plot_w
    }

    /// The top of GPU `gpu`'s row.
    fn row_y(&self, gpu: u32) -> f64 {
        self.top + gpu as f64 * (self.row_h + self.gap)
    }
}

/// The modules in plan order (stage by stage), then any other module a slice names; a
/// module's colour is its position here.
struct Modules<'a>(Vec<&'a str>);

impl<'a> Modules<'a> {
    /// The modules of `report`.
    fn of(report: &'a SimReport) -> Self {
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
        Modules(modules)
    }

    /// The colour of module `m`.
    fn colour(&self, m: &str) -> String {
        colour(self.0.iter().position(|&x| x == m).unwrap_or(0))
    }
}

/// A standalone SVG document of the report: one row per GPU (block height = SM quota, the
/// modules of a stage stacked in plan order), compute blocks solid and gradient all-reduces
/// hatched in their module's colour, stage boundaries as dashed lines, a millisecond axis, a
/// legend and a title with the simulated and predicted iteration times. Every block carries a
/// `<title>` tooltip with its numbers.
pub fn svg(report: &SimReport) -> String {
    let modules = Modules::of(report);
    let l = Layout::new(report, modules.0.len());
    let mut doc = Svg::new(l.width, l.height, "Helvetica, Arial, sans-serif", 12.0);
    hatch_pattern(&mut doc);
    header(&mut doc, &l, report);
    rows(&mut doc, &l, report);
    for sl in drawing_order(report) {
        block(
            &mut doc,
            &l,
            sl,
            report.sm_count,
            &modules.colour(&sl.module),
        );
    }
    stage_marks(&mut doc, &l, report);
    time_axis(&mut doc, &l);
    legend(&mut doc, &l, &modules);
    doc.finish()
}

/// The `hatch` pattern all-reduce blocks are overlaid with.
fn hatch_pattern(doc: &mut Svg) {
    doc.element("defs").open();
    doc.element("pattern")
        .attr("id", "hatch")
        .num("width", 6.0)
        .num("height", 6.0)
        .attr("patternUnits", "userSpaceOnUse")
        .attr("patternTransform", "rotate(45)")
        .open();
    doc.element("rect")
        .num("width", 6.0)
        .num("height", 6.0)
        .attr("fill", "white")
        .num("fill-opacity", 0.55)
        .end();
    doc.line(0.0, 0.0, 0.0, 6.0)
        .attr("stroke", "black")
        .num("stroke-opacity", 0.35)
        .num("stroke-width", 2.0)
        .end();
    doc.close("pattern");
    doc.close("defs");
}

/// The title (simulated and predicted iteration) and the line below it.
fn header(doc: &mut Svg, l: &Layout, report: &SimReport) {
    let sign = if report.prediction_error >= 0.0 {
        "+"
    } else {
        ""
    };
    let title = format!(
        "{} on {}: simulated iteration {:.1} ms (plan predicted {:.1} ms, {sign}{:.1}%)",
        report.model,
        report.cluster,
        report.iteration_ms,
        report.predicted_ms,
        100.0 * report.prediction_error
    );
    doc.text(l.left, 22.0)
        .num("font-size", 16.0)
        .attr("font-weight", "bold")
        .content(&title);
    let legend = format!(
        "{} × {} · block height = SM quota · hatched = gradient all-reduce · mean GPU \
         utilisation {:.0}% (occupancy {:.0}%)",
        report.gpus,
        report.device,
        100.0 * report.mean_utilisation,
        100.0 * report.mean_occupancy
    );
    doc.text(l.left, 40.0).attr("fill", "#555").content(&legend);
}

/// A grey row per GPU with its label, and a line between nodes.
fn rows(doc: &mut Svg, l: &Layout, report: &SimReport) {
    let font = (l.row_h * 0.7).clamp(8.0, 12.0);
    for g in 0..report.gpus {
        let y = l.row_y(g);
        doc.rect(l.left, y, l.plot_w, l.row_h)
            .attr("fill", "#f2f2f2")
            .end();
        doc.text(l.left - 6.0, y + l.row_h / 2.0 + font * 0.35)
            .attr("text-anchor", "end")
            .num("font-size", font.round())
            .content(&format!("GPU {g}"));
    }
    let gpn = report.gpus_per_node.max(1);
    for n in 1..report.gpus.div_ceil(gpn) {
        let y = l.row_y(n * gpn) - l.gap / 2.0;
        doc.line(l.left - 60.0, y, l.width - l.right, y)
            .attr("stroke", "#888")
            .num("stroke-width", 1.0)
            .end();
    }
}

/// One slice's block in `colour` with its tooltip (its quota in SMs of a `sm_count`-SM GPU
/// when that is known), and its module's name when it fits.
fn block(doc: &mut Svg, l: &Layout, sl: &Slice, sm_count: u32, colour: &str) {
    let y0 = l.row_y(sl.gpu) + sl.offset * l.row_h;
    let h = (sl.quota * l.row_h).max(0.5);
    let (x0, x1) = (l.x(sl.start_ms), l.x(sl.end_ms));
    let bw = (x1 - x0).max(0.5);
    let tip = format!(
        "{} · GPU {} · stage {} · {} {:.2}–{:.2} ms ({:.2} ms) · {}",
        sl.module,
        sl.gpu,
        sl.stage + 1,
        sl.phase.as_str(),
        sl.start_ms,
        sl.end_ms,
        sl.end_ms - sl.start_ms,
        match sm_count {
            0 => format!("quota {:.2}", sl.quota),
            n => format!("{} of {n} SMs", (sl.quota * n as f64).round()),
        }
    );
    doc.group().open();
    doc.title(&tip);
    doc.rect(x0, y0, bw, h)
        .attr("fill", colour)
        .attr("stroke", "white")
        .num("stroke-width", 0.6)
        .end();
    if sl.phase == Phase::Allreduce {
        doc.rect(x0, y0, bw, h).attr("fill", "url(#hatch)").end();
    }
    let font = (h - 2.0).min(11.0);
    let text_w = sl.module.chars().count() as f64 * font * 0.6 + 4.0;
    if sl.phase == Phase::Compute && font >= 7.0 && text_w <= bw {
        doc.text(x0 + 3.0, y0 + h / 2.0 + font * 0.35)
            .num("font-size", font)
            .attr("fill", "white")
            .content(&sl.module);
    }
    doc.close("g");
}

/// A dashed vertical line at `x` from above the first row to below the last.
fn boundary(doc: &mut Svg, l: &Layout, x: f64) {
    doc.line(x, l.top - 16.0, x, l.top + l.plot_h)
        .attr("stroke", "#333")
        .num("stroke-width", 1.0)
        .attr("stroke-dasharray", "4 3")
        .end();
}

/// Stage boundaries with their labels (the number alone where the full label does not fit),
/// and the end of the iteration.
fn stage_marks(doc: &mut Svg, l: &Layout, report: &SimReport) {
    for st in &report.stages {
        let xs = l.x(st.start_ms);
        let xe = l.x(st.start_ms + st.time_ms);
        boundary(doc, l, xs);
        let label = format!("stage {} · {:.1} ms", st.index + 1, st.time_ms);
        let fits = label.chars().count() as f64 * 6.6 <= (xe - xs - 4.0);
        let short = format!("{}", st.index + 1);
        doc.text(xs + 3.0, l.top - 6.0)
            .attr("fill", "#333")
            .content(if fits { &label } else { &short });
    }
    boundary(doc, l, l.x(l.span));
}

/// The millisecond axis below the rows, with round ticks.
fn time_axis(doc: &mut Svg, l: &Layout) {
    let axis_y = l.axis_y;
    doc.line(l.left, axis_y, l.left + l.plot_w, axis_y)
        .attr("stroke", "#333")
        .end();
    let step = tick_step(l.span, 10.0);
    let mut k = 0;
    loop {
        let t = k as f64 * step;
        if t > l.span * (1.0 + 1e-9) {
            break;
        }
        let xt = l.x(t);
        let label = if step >= 1.0 {
            format!("{t:.0}")
        } else {
            format!("{t:.*}", (-step.log10().floor()) as usize)
        };
        doc.line(xt, axis_y, xt, axis_y + 5.0)
            .attr("stroke", "#333")
            .end();
        doc.text(xt, axis_y + 18.0)
            .attr("text-anchor", "middle")
            .content(&label);
        k += 1;
    }
    doc.text(l.left + l.plot_w, axis_y + 32.0)
        .attr("text-anchor", "end")
        .attr("fill", "#555")
        .content("time (ms)");
}

/// A swatch and name per module, then the hatched all-reduce swatch.
fn legend(doc: &mut Svg, l: &Layout, modules: &Modules) {
    let col_w = l.plot_w / LEGEND_COLS as f64;
    let mut entries: Vec<(String, String, bool)> = modules
        .0
        .iter()
        .map(|m| (m.to_string(), modules.colour(m), false))
        .collect();
    entries.push(("gradient all-reduce".into(), "#888888".into(), true));
    for (i, (name, c, hatched)) in entries.iter().enumerate() {
        let lx = l.left + (i % LEGEND_COLS) as f64 * col_w;
        let ly = l.legend_y + (i / LEGEND_COLS) as f64 * 20.0;
        doc.rect(lx, ly - 10.0, 14.0, 12.0).attr("fill", c).end();
        if *hatched {
            doc.rect(lx, ly - 10.0, 14.0, 12.0)
                .attr("fill", "url(#hatch)")
                .end();
        }
        doc.text(lx + 19.0, ly).content(name);
    }
}

/// The slices, compute first so that text on blocks is not hidden by later all-reduces.
fn drawing_order(report: &SimReport) -> Vec<&Slice> {
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
}
