//! Grouped bar charts as standalone SVG, for `mosaic report` (the paper's Figs. 9, 10, 14a).

use mosaic_kit::svg::{round_step, Svg};

/// A grouped bar chart: one group per category, one bar per series within each group.
pub struct BarChart<'a> {
    /// Title above the plot.
    pub title: &'a str,
    /// Label of the value axis.
    pub y_label: &'a str,
    /// Category names along the x axis.
    pub groups: Vec<String>,
    /// Series names, in bar order; each gets a colour and a legend entry.
    pub series: Vec<String>,
    /// `values[group][series]`; `None` draws no bar (e.g. a strategy that does not apply).
    pub values: Vec<Vec<Option<f64>>>,
}

/// Colour-blind-safe palette (Okabe & Ito, 2008), then greys.
const PALETTE: [&str; 10] = [
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000",
    "#999999", "#666666",
];

/// The colour of series `i`.
fn colour(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// A "nice" upper bound and tick step for an axis from 0 to `max`.
fn nice_axis(max: f64) -> (f64, f64) {
    if max.is_nan() || max <= 0.0 {
        return (1.0, 0.2);
    }
    let step = round_step(max / 5.0, &[1.0, 2.0, 2.5, 5.0]);
    ((max / step).ceil() * step, step)
}

/// Where a chart's parts go, in pixels.
struct Frame {
    left: f64,
    top: f64,
    /// Space below the plot for the group labels and the legend.
    bottom: f64,
    plot_w: f64,
    plot_h: f64,
    bar_w: f64,
    group_w: f64,
    /// Top of the value axis and its tick step.
    y_max: f64,
    step: f64,
}

impl Frame {
    /// The y of value `v`.
    fn y(&self, v: f64) -> f64 {
        self.top + self.plot_h - self.plot_h * v / self.y_max
    }
}

impl BarChart<'_> {
    /// Renders the chart as an SVG document.
    pub fn svg(&self) -> String {
        let bar_w = 14.0;
        let group_w = bar_w * self.series.len() as f64 + 24.0;
        let max = self
            .values
            .iter()
            .flatten()
            .flatten()
            .copied()
            .fold(0.0, f64::max);
        let (y_max, step) = nice_axis(max);
        let f = Frame {
            left: 70.0,
            top: 40.0,
            bottom: 90.0,
            plot_w: group_w * self.groups.len().max(1) as f64,
            plot_h: 260.0,
            bar_w,
            group_w,
            y_max,
            step,
        };
        let legend_h = 18.0 * self.series.len().div_ceil(4) as f64;
        let width = f.left + f.plot_w + 20.0;
        let height = f.top + f.plot_h + f.bottom + legend_h;
        let mut doc = Svg::new(width, height, "sans-serif", 11.0);
        doc.text(width / 2.0, 22.0)
            .num("font-size", 14.0)
            .attr("text-anchor", "middle")
            .content(self.title);
        self.value_axis(&mut doc, &f);
        self.bars(&mut doc, &f);
        self.legend(&mut doc, &f);
        doc.finish()
    }

    /// Grid lines with their values, and the axis label.
    fn value_axis(&self, doc: &mut Svg, f: &Frame) {
        let mut v = 0.0;
        while v <= f.y_max + f.step * 1e-9 {
            doc.line(f.left, f.y(v), f.left + f.plot_w, f.y(v))
                .attr("stroke", "#ddd")
                .end();
            doc.text(f.left - 6.0, f.y(v) + 4.0)
                .attr("text-anchor", "end")
                .content(&format_tick(v, f.step));
            v += f.step;
        }
        doc.rotated_text(16.0, f.top + f.plot_h / 2.0, -90.0)
            .attr("text-anchor", "middle")
            .content(self.y_label);
    }

    /// The bars of every group, each with a tooltip, the group names below, and the baseline.
    fn bars(&self, doc: &mut Svg, f: &Frame) {
        let base = f.top + f.plot_h;
        for (gi, group) in self.groups.iter().enumerate() {
            let x0 = f.left + gi as f64 * f.group_w + 12.0;
            for (si, value) in self.values[gi].iter().enumerate() {
                if let Some(value) = *value {
                    let x = x0 + si as f64 * f.bar_w;
                    doc.rect(x, f.y(value), f.bar_w - 1.0, (base - f.y(value)).max(0.0))
                        .attr("fill", colour(si))
                        .title(&format!("{group}: {} = {value:.3}", self.series[si]));
                }
            }
            doc.rotated_text(
                x0 + f.bar_w * self.series.len() as f64 / 2.0,
                base + 14.0,
                -30.0,
            )
            .attr("text-anchor", "end")
            .content(group);
        }
        doc.line(f.left, base, f.left + f.plot_w, base)
            .attr("stroke", "black")
            .end();
    }

    /// A swatch and name per series, four to a line.
    fn legend(&self, doc: &mut Svg, f: &Frame) {
        for (si, name) in self.series.iter().enumerate() {
            let (col, row) = (si % 4, si / 4);
            let x = f.left + col as f64 * 150.0;
            let yy = f.top + f.plot_h + f.bottom - 10.0 + row as f64 * 18.0;
            doc.rect(x, yy - 9.0, 10.0, 10.0)
                .attr("fill", colour(si))
                .end();
            doc.text(x + 14.0, yy).content(name);
        }
    }
}

/// The label of tick `v` with as many decimals as `step` needs.
fn format_tick(v: f64, step: f64) -> String {
    if step >= 1.0 {
        format!("{v:.0}")
    } else if step >= 0.1 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_is_nice_and_covers_the_data() {
        assert_eq!(nice_axis(1.37), (1.5, 0.5));
        assert_eq!(nice_axis(930.0), (1000.0, 200.0));
        let (top, step) = nice_axis(0.47);
        assert!(top >= 0.47 && step > 0.0);
    }

    #[test]
    fn chart_has_one_bar_per_value_and_a_legend() {
        let chart = BarChart {
            title: "t <1>",
            y_label: "ms",
            groups: vec!["clip".into(), "ofasys".into()],
            series: vec!["A".into(), "B".into()],
            values: vec![vec![Some(1.0), Some(2.0)], vec![Some(3.0), None]],
        };
        let svg = chart.svg();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<title>").count(), 3);
        assert!(svg.contains("t &lt;1&gt;"));
    }
}
