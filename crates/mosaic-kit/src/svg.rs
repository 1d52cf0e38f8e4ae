//! A writer of standalone SVG documents: the preamble, the primitives the pipeline's pictures
//! are drawn with (rectangles, lines, circles, text, groups, tooltips), XML escaping, and the
//! round tick steps of their axes.
//!
//! Every element is written on its own line; numbers are written with at most two decimals
//! (a hundredth of a pixel), without trailing zeros.
//!
//! ```
//! use mosaic_kit::svg::Svg;
//! let mut doc = Svg::new(120.0, 40.0, "sans-serif", 11.0);
//! doc.rect(10.0, 10.0, 50.5, 20.0).attr("fill", "#0072B2").title("a & b: 1.5 ms");
//! doc.line(0.0, 35.0, 120.0, 35.0).attr("stroke", "black").end();
//! let svg = doc.finish();
//! assert!(svg.contains(r##"<rect x="10" y="10" width="50.5" height="20" fill="#0072B2">"##));
//! assert!(svg.contains("<title>a &amp; b: 1.5 ms</title></rect>"));
//! assert!(svg.trim_end().ends_with("</svg>"));
//! ```

use std::fmt::Write;

/// Escapes text for XML content and attribute values.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

/// `v` as an attribute value: at most two decimals, no trailing zeros (`12.5`, `70`).
pub fn num(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        &s
    };
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

/// The smallest round step at least `raw`: one of `mantissas` (ascending, e.g. `[1, 2, 5]`)
/// times a power of ten, or ten times that power when none is large enough. With `raw` the
/// span of an axis divided by the ticks wanted, it gives ticks at round values.
pub fn round_step(raw: f64, mantissas: &[f64]) -> f64 {
    let mag = 10f64.powf(raw.log10().floor());
    mantissas
        .iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * mag)
}

/// An SVG document being written, white background included; [`Svg::finish`] closes it.
#[derive(Debug, Clone)]
pub struct Svg {
    out: String,
}

impl Svg {
    /// A document of `width` × `height` pixels (rounded to whole pixels, with the same
    /// viewBox), text in `font_family` at `font_size` pixels, on a white background.
    pub fn new(width: f64, height: f64, font_family: &str, font_size: f64) -> Svg {
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="{}" font-size="{}">"#,
            escape(font_family),
            num(font_size)
        );
        let mut svg = Svg { out };
        svg.element("rect")
            .attr("width", "100%")
            .attr("height", "100%")
            .attr("fill", "white")
            .end();
        svg
    }

    /// Starts an element `<name`: add attributes, then end it.
    pub fn element(&mut self, name: &'static str) -> Element<'_> {
        self.out.push('<');
        self.out.push_str(name);
        Element {
            out: &mut self.out,
            name,
        }
    }

    /// A rectangle with its top left corner at (`x`, `y`).
    pub fn rect(&mut self, x: f64, y: f64, width: f64, height: f64) -> Element<'_> {
        self.element("rect")
            .num("x", x)
            .num("y", y)
            .num("width", width)
            .num("height", height)
    }

    /// A line from (`x1`, `y1`) to (`x2`, `y2`); it needs a `stroke` to be seen.
    pub fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64) -> Element<'_> {
        self.element("line")
            .num("x1", x1)
            .num("y1", y1)
            .num("x2", x2)
            .num("y2", y2)
    }

    /// A circle of radius `r` centred at (`cx`, `cy`).
    pub fn circle(&mut self, cx: f64, cy: f64, r: f64) -> Element<'_> {
        self.element("circle")
            .num("cx", cx)
            .num("cy", cy)
            .num("r", r)
    }

    /// Text whose baseline starts at (`x`, `y`) (see `text-anchor`); end it with
    /// [`Element::content`].
    pub fn text(&mut self, x: f64, y: f64) -> Element<'_> {
        self.element("text").num("x", x).num("y", y)
    }

    /// Text anchored at (`x`, `y`) and turned by `degrees` (clockwise; -90 reads upwards).
    pub fn rotated_text(&mut self, x: f64, y: f64, degrees: f64) -> Element<'_> {
        let transform = format!("translate({} {}) rotate({})", num(x), num(y), num(degrees));
        self.element("text").attr("transform", &transform)
    }

    /// A group `<g>`: give its attributes, [`Element::open`] it, draw its children, then
    /// [`Svg::close`] it with `"g"`.
    pub fn group(&mut self) -> Element<'_> {
        self.element("g")
    }

    /// Closes an element opened with [`Element::open`].
    pub fn close(&mut self, name: &str) {
        let _ = writeln!(self.out, "</{name}>");
    }

    /// A tooltip for the enclosing element (inside a group: for the whole group).
    pub fn title(&mut self, text: &str) {
        let _ = writeln!(self.out, "<title>{}</title>", escape(text));
    }

    /// Closes the document and returns its text.
    pub fn finish(mut self) -> String {
        self.out.push_str("</svg>\n");
        self.out
    }
}

/// An element whose start tag is being written; one of [`Element::end`], [`Element::title`],
/// [`Element::content`] or [`Element::open`] finishes it.
#[must_use = "an element must be ended"]
#[derive(Debug)]
pub struct Element<'a> {
    out: &'a mut String,
    name: &'static str,
}

impl Element<'_> {
    /// Adds the attribute `name="value"`, escaping the value.
    pub fn attr(self, name: &str, value: &str) -> Self {
        let _ = write!(self.out, r#" {name}="{}""#, escape(value));
        self
    }

    /// Adds a numeric attribute, written by [`num`].
    pub fn num(self, name: &str, value: f64) -> Self {
        let _ = write!(self.out, r#" {name}="{}""#, num(value));
        self
    }

    /// Ends it as an empty element: `/>`.
    pub fn end(self) {
        self.out.push_str("/>\n");
    }

    /// Ends it with a tooltip inside: `><title>…</title></name>`.
    pub fn title(self, text: &str) {
        let _ = writeln!(self.out, "><title>{}</title></{}>", escape(text), self.name);
    }

    /// Ends it with `text` (escaped) as its content: `>…</name>`.
    pub fn content(self, text: &str) {
        let _ = writeln!(self.out, ">{}</{}>", escape(text), self.name);
    }

    /// Ends the start tag only: children follow, then [`Svg::close`].
    pub fn open(self) {
        self.out.push_str(">\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped() {
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
        assert_eq!(escape("it's > 1"), "it&apos;s &gt; 1");
    }

    #[test]
    fn numbers_are_short() {
        assert_eq!(num(70.0), "70");
        assert_eq!(num(12.5), "12.5");
        assert_eq!(num(1.0 / 3.0), "0.33");
        assert_eq!(num(-0.001), "0");
        assert_eq!(num(-2.456), "-2.46");
        assert_eq!(num(1e4), "10000");
    }

    #[test]
    fn steps_are_round() {
        let step = |raw| round_step(raw, &[1.0, 2.0, 5.0]);
        for (raw, want) in [
            (11.45, 20.0),
            (2.68, 5.0),
            (0.9, 1.0),
            (0.03, 0.05),
            (7.0, 10.0),
        ] {
            assert!((step(raw) - want).abs() < 1e-9 * want, "{raw}");
        }
        assert_eq!(round_step(0.22, &[1.0, 2.0, 2.5, 5.0, 10.0]), 0.25);
    }

    #[test]
    fn documents_are_well_formed() {
        let mut doc = Svg::new(100.4, 50.6, "Helvetica, Arial", 12.0);
        doc.group().attr("fill", "red").open();
        doc.title("two <dots>");
        doc.circle(1.0, 2.0, 3.0).end();
        doc.circle(4.0, 5.0, 3.0).end();
        doc.close("g");
        doc.text(5.0, 6.0).attr("text-anchor", "end").content("x");
        doc.rotated_text(16.0, 25.0, -90.0).content("y");
        let svg = doc.finish();
        assert!(svg.starts_with(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="100" height="51" viewBox="0 0 100 51" font-family="Helvetica, Arial" font-size="12">"#
        ));
        assert!(svg.contains(r#"<rect width="100%" height="100%" fill="white"/>"#));
        assert!(svg.contains("<g fill=\"red\">\n<title>two &lt;dots&gt;</title>\n<circle"));
        assert!(svg.contains(r#"<circle cx="4" cy="5" r="3"/>"#));
        assert!(svg.contains(r#"<text x="5" y="6" text-anchor="end">x</text>"#));
        assert!(svg.contains(r#"<text transform="translate(16 25) rotate(-90)">y</text>"#));
        // One element a line, the document closed last.
        let tail = concat!(
            "</g>\n",
            "<text x=\"5\" y=\"6\" text-anchor=\"end\">x</text>\n",
            "<text transform=\"translate(16 25) rotate(-90)\">y</text>\n",
            "</svg>\n"
        );
        assert!(svg.ends_with(tail), "{svg}");
    }
}
