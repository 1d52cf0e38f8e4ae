//! `svg`: the picture of a simulated plan is well-formed SVG that shows the plan.

use mosaic_sim::{simulate, svg};

mod common;
use common::{planned, zoo};

/// Checks that every tag of an XML document is closed in order (no DTD, no CDATA).
fn assert_balanced(xml: &str) {
    let mut stack: Vec<String> = Vec::new();
    let mut rest = xml;
    while let Some(open) = rest.find('<') {
        let close = rest[open..].find('>').expect("a tag ends") + open;
        let tag = &rest[open + 1..close];
        assert!(!tag.contains('<'), "a '<' inside a tag: {tag}");
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(name.trim()), "close {name}");
        } else if !tag.ends_with('/') {
            let name = tag.split_whitespace().next().unwrap();
            stack.push(name.to_string());
        }
        rest = &rest[close + 1..];
    }
    assert!(stack.is_empty(), "unclosed: {stack:?}");
}

#[test]
fn svg_is_a_well_formed_picture_of_the_plan() {
    let (m, c) = zoo("ofasys", "h100x8");
    let plan = planned(&m, &c);
    let r = simulate(&plan, "plan.json", &m, &c).unwrap();
    let svg = svg(&r);
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_balanced(&svg);
    for module in &m.modules {
        assert!(
            svg.contains(&format!(">{}</text>", module.name)),
            "{}",
            module.name
        );
    }
    assert!(svg.contains("stage 1") && svg.contains("GPU 7") && svg.contains("time (ms)"));
    assert!(svg.contains(&format!("{:.1} ms", r.iteration_ms)));
    // One block per slice, each with its tooltip.
    assert_eq!(svg.matches("<title>").count(), r.slices.len());
    // Tooltips give each block's quota in the H100's SMs.
    assert_eq!(r.sm_count, 132);
    assert_eq!(svg.matches(" of 132 SMs</title>").count(), r.slices.len());
    // A name that needs escaping stays well formed.
    let mut odd = r.clone();
    odd.model = "a<b&c".into();
    assert_balanced(&mosaic_sim::svg(&odd));
}
