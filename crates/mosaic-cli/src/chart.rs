//! Grouped bar charts as standalone SVG, for `mosaic report` (the paper's Figs. 9, 10, 14a).

use std::fmt::Write;

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

/// Escapes text for SVG.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" upper bound and tick step for an axis from 0 to `max`.
fn nice_axis(max: f64) -> (f64, f64) {
    if max.is_nan() || max <= 0.0 {
        return (1.0, 0.2);
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|k| k * mag)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * mag);
    ((max / step).ceil() * step, step)
}

impl BarChart<'_> {
    /// Renders the chart as an SVG document.
    pub fn svg(&self) -> String {
        let (left, right, top, bottom) = (70.0, 20.0, 40.0, 90.0);
        let bar_w = 14.0;
        let group_w = bar_w * self.series.len() as f64 + 24.0;
        let plot_w = group_w * self.groups.len().max(1) as f64;
        let plot_h = 260.0;
        let legend_h = 18.0 * self.series.len().div_ceil(4) as f64;
        let width = left + plot_w + right;
        let height = top + plot_h + bottom + legend_h;
        let max = self
            .values
            .iter()
            .flatten()
            .flatten()
            .copied()
            .fold(0.0, f64::max);
        let (y_max, step) = nice_axis(max);
        let y = |v: f64| top + plot_h - plot_h * v / y_max;
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" font-family="sans-serif" font-size="11">"#
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="22" font-size="14" text-anchor="middle">{}</text>"#,
            width / 2.0,
            escape(self.title)
        );
        let mut v = 0.0;
        while v <= y_max + step * 1e-9 {
            let _ = writeln!(
                s,
                r##"<line x1="{left}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                left + plot_w,
                y(v),
                y(v),
                left - 6.0,
                y(v) + 4.0,
                format_tick(v, step)
            );
            v += step;
        }
        let _ = writeln!(
            s,
            r#"<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
            top + plot_h / 2.0,
            escape(self.y_label)
        );
        for (gi, group) in self.groups.iter().enumerate() {
            let x0 = left + gi as f64 * group_w + 12.0;
            for (si, value) in self.values[gi].iter().enumerate() {
                if let Some(value) = value {
                    let x = x0 + si as f64 * bar_w;
                    let _ = writeln!(
                        s,
                        r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {} = {value:.3}</title></rect>"#,
                        y(*value),
                        bar_w - 1.0,
                        (top + plot_h - y(*value)).max(0.0),
                        PALETTE[si % PALETTE.len()],
                        escape(group),
                        escape(&self.series[si])
                    );
                }
            }
            let _ = writeln!(
                s,
                r#"<text transform="translate({:.1} {:.1}) rotate(-30)" text-anchor="end">{}</text>"#,
                x0 + bar_w * self.series.len() as f64 / 2.0,
                top + plot_h + 14.0,
                escape(group)
            );
        }
        let _ = writeln!(
            s,
            r#"<line x1="{left}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="black"/>"#,
            left + plot_w,
            top + plot_h,
            top + plot_h
        );
        for (si, name) in self.series.iter().enumerate() {
            let (col, row) = (si % 4, si / 4);
            let x = left + col as f64 * 150.0;
            let yy = top + plot_h + bottom - 10.0 + row as f64 * 18.0;
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{:.1}" width="10" height="10" fill="{}"/><text x="{:.1}" y="{yy:.1}">{}</text>"#,
                yy - 9.0,
                PALETTE[si % PALETTE.len()],
                x + 14.0,
                escape(name)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

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
