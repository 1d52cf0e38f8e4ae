//! Predicted vs measured scatter plots as standalone SVG, like the paper's Fig. 8b: one colour
//! per model, the y = x line, ticks, and a legend with each model's R².

use mosaic_kit::svg::{round_step, Svg};

use crate::observe::Observation;
use crate::regression::{test_set, FitReport, Model};

/// One observation as plotted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScatterPoint {
    /// Measured time, ms.
    pub measured_ms: f64,
    /// Predicted time, ms.
    pub predicted_ms: f64,
    /// The scaling surface's time alone, ms (to plot slowdowns).
    pub base_ms: f64,
}

/// One model's points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Its points.
    pub points: Vec<ScatterPoint>,
}

/// Model colours (Okabe & Ito's colour-blind-safe palette): unaware, additive, full.
const COLOURS: [&str; 3] = ["#D55E00", "#E69F00", "#0072B2"];

fn colour(i: usize) -> &'static str {
    COLOURS[i % COLOURS.len()]
}

/// The held-out observations of `obs` predicted by each model of `report`, with the model's
/// held-out R² (of times and of slowdowns) and mean error in the legend text.
pub fn scatter_series(report: &FitReport, obs: &[Observation]) -> Vec<Series> {
    let test = test_set(obs, report.holdout_every);
    Model::ALL
        .iter()
        .map(|&m| {
            let f = report.model(m);
            let r2 = |x: Option<f64>, digits: usize| {
                x.map_or("n/a".to_string(), |v| format!("{v:.digits$}"))
            };
            Series {
                name: format!(
                    "{}: R² {} · slowdown R² {} · mean error {:.2}%",
                    m.describe(),
                    r2(f.test.r2, 6),
                    r2(f.test.r2_slowdown, 3),
                    100.0 * f.test.mean_rel_err
                ),
                points: test
                    .iter()
                    .map(|o| ScatterPoint {
                        measured_ms: o.measured_ms,
                        predicted_ms: o.predict(&f.interference),
                        base_ms: o.base_ms,
                    })
                    .collect(),
            }
        })
        .collect()
}

/// One axis: a value range, linear or logarithmic.
#[derive(Debug, Clone, Copy)]
struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
}

impl Axis {
    /// An axis covering `values`: logarithmic when they are positive and span more than
    /// 1.5 decades, else linear with a little margin.
    fn covering(values: impl Iterator<Item = f64> + Clone) -> Axis {
        let (min, max) = values
            .filter(|v| v.is_finite())
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                (a.min(v), b.max(v))
            });
        if !min.is_finite() {
            return Axis {
                lo: 0.0,
                hi: 1.0,
                log: false,
            };
        }
        if min > 0.0 && max / min > 10f64.powf(1.5) {
            Axis {
                lo: min / 1.15,
                hi: max * 1.15,
                log: true,
            }
        } else {
            let pad = ((max - min) * 0.05).max(1e-3 * max.abs().max(1e-9));
            Axis {
                lo: min - pad,
                hi: max + pad,
                log: false,
            }
        }
    }

    /// Position of `v` in [0, 1].
    fn pos(&self, v: f64) -> f64 {
        if self.log {
            (v.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        }
    }

    /// Tick values: 1-2-5 per decade on a log axis, a nice step on a linear one.
    fn ticks(&self) -> Vec<f64> {
        let mut out = Vec::new();
        if self.log {
            let mut decade = 10f64.powf(self.lo.log10().floor());
            while decade <= self.hi {
                for k in [1.0, 2.0, 5.0] {
                    let v = k * decade;
                    if v >= self.lo && v <= self.hi {
                        out.push(v);
                    }
                }
                decade *= 10.0;
            }
        } else {
            let raw = (self.hi - self.lo) / 6.0;
            let step = round_step(raw, &[1.0, 2.0, 2.5, 5.0]);
            let mut v = (self.lo / step).ceil() * step;
            while v <= self.hi + 1e-9 * step {
                out.push(if v.abs() < 1e-12 * step { 0.0 } else { v });
                v += step;
            }
        }
        out
    }
}

fn tick_label(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else {
        let t = format!("{v:.2}");
        t.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Draws one square panel at (x0, y0) of side `side`: points of every series, the y = x line,
/// ticks and axis labels.
fn panel(
    doc: &mut Svg,
    (x0, y0, side): (f64, f64, f64),
    title: &str,
    label: &str,
    series: &[Vec<(f64, f64)>],
) {
    let axis = Axis::covering(series.iter().flatten().flat_map(|p| [p.0, p.1]));
    let px = |v: f64| x0 + side * axis.pos(v).clamp(-0.02, 1.02);
    let py = |v: f64| y0 + side - side * axis.pos(v).clamp(-0.02, 1.02);
    doc.text(x0 + side / 2.0, y0 - 10.0)
        .num("font-size", 13.0)
        .attr("text-anchor", "middle")
        .content(title);
    for v in axis.ticks() {
        let (x, y) = (px(v), py(v));
        doc.line(x, y0, x, y0 + side).attr("stroke", "#eee").end();
        doc.line(x0, y, x0 + side, y).attr("stroke", "#eee").end();
        doc.text(x, y0 + side + 14.0)
            .attr("text-anchor", "middle")
            .content(&tick_label(v));
        doc.text(x0 - 5.0, y + 4.0)
            .attr("text-anchor", "end")
            .content(&tick_label(v));
    }
    doc.rect(x0, y0, side, side)
        .attr("fill", "none")
        .attr("stroke", "black")
        .end();
    doc.line(px(axis.lo), py(axis.lo), px(axis.hi), py(axis.hi))
        .attr("stroke", "#555")
        .attr("stroke-dasharray", "4 3")
        .title("y = x");
    for (i, pts) in series.iter().enumerate() {
        doc.group()
            .attr("fill", colour(i))
            .num("fill-opacity", 0.55)
            .open();
        for &(m, p) in pts {
            if m.is_finite() && p.is_finite() {
                doc.circle(px(m), py(p), 2.4).end();
            }
        }
        doc.close("g");
    }
    let scale = if axis.log { " (log scale)" } else { "" };
    doc.text(x0 + side / 2.0, y0 + side + 32.0)
        .attr("text-anchor", "middle")
        .content(&format!("measured {label}{scale}"));
    doc.rotated_text(x0 - 48.0, y0 + side / 2.0, -90.0)
        .attr("text-anchor", "middle")
        .content(&format!("predicted {label}{scale}"));
}

/// The points of every series, as (measured, predicted) by `of`.
fn points(series: &[Series], of: impl Fn(&ScatterPoint) -> (f64, f64)) -> Vec<Vec<(f64, f64)>> {
    series
        .iter()
        .map(|se| se.points.iter().map(&of).collect())
        .collect()
}

/// The scatter plot of `series` as an SVG document: on the left predicted vs measured time
/// (log-log when the times span more than 1.5 decades), on the right predicted vs measured
/// slowdown (`time / f_m(dp, sm) − 1`), each with the y = x line; one colour per series and a
/// legend with the series names.
pub fn scatter_svg(title: &str, series: &[Series]) -> String {
    let side = 380.0;
    let (left, gap, top) = (70.0, 90.0, 60.0);
    let legend_top = top + side + 60.0;
    let width = left + 2.0 * side + gap + 30.0;
    let height = legend_top + 20.0 * series.len() as f64 + 10.0;
    let mut doc = Svg::new(width, height, "sans-serif", 11.0);
    doc.text(width / 2.0, 22.0)
        .num("font-size", 15.0)
        .attr("text-anchor", "middle")
        .content(title);
    let times = points(series, |p| (p.measured_ms, p.predicted_ms));
    let slowdowns = points(series, |p| {
        (
            p.measured_ms / p.base_ms - 1.0,
            p.predicted_ms / p.base_ms - 1.0,
        )
    });
    panel(
        &mut doc,
        (left, top, side),
        "iteration time",
        "time (ms)",
        &times,
    );
    panel(
        &mut doc,
        (left + side + gap, top, side),
        "slowdown from co-location",
        "slowdown",
        &slowdowns,
    );
    for (i, se) in series.iter().enumerate() {
        let y = legend_top + 20.0 * i as f64;
        doc.circle(left + 5.0, y - 4.0, 5.0)
            .attr("fill", colour(i))
            .end();
        doc.text(left + 16.0, y).content(&se.name);
    }
    doc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plot_has_every_point_a_diagonal_and_a_legend() {
        let pts = |k: f64| {
            (1..=20)
                .map(|i| ScatterPoint {
                    measured_ms: 2.0 * i as f64 * i as f64,
                    predicted_ms: k * 2.0 * i as f64 * i as f64,
                    base_ms: 1.5 * i as f64 * i as f64,
                })
                .collect::<Vec<_>>()
        };
        let series = vec![
            Series {
                name: "a <R² 1>".into(),
                points: pts(1.0),
            },
            Series {
                name: "b".into(),
                points: pts(0.9),
            },
        ];
        let svg = scatter_svg("t & u", &series);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        // 2 series × 20 points × 2 panels + 2 legend markers.
        assert_eq!(svg.matches("<circle").count(), 2 * 20 * 2 + 2);
        assert_eq!(svg.matches("y = x").count(), 2);
        assert!(svg.contains("a &lt;R² 1&gt;") && svg.contains("t &amp; u"));
        assert!(svg.contains("(log scale)"), "2..800 ms spans 2.6 decades");
    }

    #[test]
    fn ticks_cover_the_axis() {
        let log = Axis {
            lo: 1.5,
            hi: 900.0,
            log: true,
        };
        assert_eq!(
            log.ticks(),
            vec![2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0]
        );
        let lin = Axis {
            lo: -0.05,
            hi: 1.05,
            log: false,
        };
        let t = lin.ticks();
        assert_eq!(t.first(), Some(&0.0));
        assert!(t.last().unwrap() <= &1.05 && t.len() >= 4);
    }
}
