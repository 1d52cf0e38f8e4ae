//! Every JSON loader of the planner side on hostile input: thousands of mutations of valid
//! profiles, colocation files and plans — a number replaced by an extreme value, a field
//! removed, an array element duplicated or dropped, bytes flipped or cut — each gives a value
//! or a clear error, never a panic. What loads is then used as a user would: profiles are
//! planned on 1–4 GPUs, plans are resolved against the model.

use std::path::Path;

use mosaic_plan::{parse_plan, solve, ModuleGraph, Search, SolveOptions};
use mosaic_profile::{parse, parse_colocations, PerfModel};
use proptest::prelude::*;
use serde_json::{json, Value};

/// A small profile: two encoders and a head, dp 1 and 2, quotas 0.5 and 1.0.
fn profile() -> Value {
    let samples: Vec<Value> = [
        (1, 0.5, 90.0),
        (1, 1.0, 60.0),
        (2, 0.5, 50.0),
        (2, 1.0, 35.0),
    ]
    .iter()
    .map(|&(dp, sm, t)| {
        json!({"dp": dp, "sm": sm, "time_ms": t, "mem_gib": 2.0, "sm_util": 0.6,
                   "bw_util": 0.3})
    })
    .collect();
    let module = |name: &str, after: &[&str]| json!({"name": name, "after": after, "samples": samples.clone()});
    json!({"format": "mosaic-profiles/1",
           "device": {"name": "gpu", "sm_count": 100, "memory_gib": 80.0},
           "modules": [module("a", &[]), module("b", &[]), module("head", &["a", "b"])],
           "interference": {"e1": 0.01, "e2": 0.05, "e3": 0.3}})
}

fn colocations() -> Value {
    json!({"format": "mosaic-colocations/1", "device": "gpu",
           "samples": [{"modules": [{"name": "a", "dp": 1, "sm": 0.5, "time_ms": 95.0},
                                    {"name": "b", "dp": 1, "sm": 0.5, "time_ms": 97.0}]}]})
}

fn plan() -> Value {
    let model =
        PerfModel::new(&parse(&profile().to_string(), "p.json").unwrap(), 0.1, "p").unwrap();
    let opts = SolveOptions {
        search: Search::Exact,
        ..Default::default()
    };
    serde_json::to_value(solve(&model, 2, &opts).unwrap()).unwrap()
}

/// One way to damage a JSON file.
#[derive(Debug, Clone)]
enum Mutation {
    /// Replace the k-th leaf (in document order) with an extreme or ill-typed value.
    Leaf(usize, usize),
    /// Remove the k-th object field.
    Remove(usize),
    /// Duplicate (or drop) the first element of the k-th array.
    Array(usize, bool),
    /// Flip a byte of the text.
    Flip(usize, u8),
    /// Cut the text at a fraction (thousandths) of its length.
    Cut(u16),
}

const EXTREMES: [&str; 16] = [
    "0",
    "-1",
    "1e308",
    "-1e308",
    "1e-320",
    "4000000000",
    "18446744073709551615",
    "0.5",
    "2",
    "\"x\"",
    "null",
    "[]",
    "{}",
    "true",
    "65537",
    "1e9",
];

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 0..EXTREMES.len()).prop_map(|(k, v)| Mutation::Leaf(k, v)),
        2 => any::<usize>().prop_map(Mutation::Remove),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(k, d)| Mutation::Array(k, d)),
        1 => (any::<usize>(), 1..=255u8).prop_map(|(i, x)| Mutation::Flip(i, x)),
        1 => (0..1000u16).prop_map(Mutation::Cut),
    ]
}

/// Visits every value of `v` in document order, depth first.
fn walk<'a>(v: &'a mut Value, visit: &mut dyn FnMut(&mut Value)) {
    visit(v);
    match v {
        Value::Array(a) => a.iter_mut().for_each(|x| walk(x, visit)),
        Value::Object(o) => o.values_mut().for_each(|x| walk(x, visit)),
        _ => {}
    }
}

/// Applies `k`-th-of-a-kind edits: `pick` says whether a value is of the kind, `edit` changes
/// the chosen one.
fn nth(v: &mut Value, k: usize, pick: fn(&Value) -> bool, edit: &mut dyn FnMut(&mut Value)) {
    let mut count = 0;
    walk(v, &mut |x| count += pick(x) as usize);
    if count == 0 {
        return;
    }
    let (target, mut i) = (k % count, 0);
    walk(v, &mut |x| {
        if pick(x) {
            if i == target {
                edit(x);
            }
            i += 1;
        }
    });
}

fn damage(good: &Value, mutations: &[Mutation]) -> String {
    let mut v = good.clone();
    let mut bytes_edits = Vec::new();
    for m in mutations {
        match m {
            Mutation::Leaf(k, e) => {
                let value: Value = serde_json::from_str(EXTREMES[*e]).unwrap_or(Value::Null);
                let leaf = |x: &Value| !x.is_array() && !x.is_object();
                nth(&mut v, *k, leaf, &mut |x| *x = value.clone());
            }
            Mutation::Remove(k) => {
                let object = |x: &Value| x.as_object().is_some_and(|o| !o.is_empty());
                nth(&mut v, *k, object, &mut |x| {
                    let o = x.as_object_mut().unwrap();
                    let key = o.keys().nth(*k % o.len()).unwrap().clone();
                    o.remove(&key);
                });
            }
            Mutation::Array(k, dup) => {
                let array = |x: &Value| x.as_array().is_some_and(|a| !a.is_empty());
                nth(&mut v, *k, array, &mut |x| {
                    let a = x.as_array_mut().unwrap();
                    if *dup {
                        a.push(a[0].clone());
                    } else {
                        a.remove(0);
                    }
                });
            }
            other => bytes_edits.push(other.clone()),
        }
    }
    let mut b = v.to_string().into_bytes();
    for m in bytes_edits {
        match m {
            Mutation::Flip(i, x) if !b.is_empty() => {
                let n = b.len();
                b[i % n] ^= x;
            }
            Mutation::Cut(k) => b.truncate(b.len() * k as usize / 1000),
            _ => {}
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    /// A damaged profile loads or is refused; what loads builds a model that plans on 1–4 GPUs
    /// or says why it cannot.
    #[test]
    fn damaged_profiles_never_panic(
        ms in prop::collection::vec(mutation(), 1..4),
        gpus in 1u32..=4,
    ) {
        let text = damage(&profile(), &ms);
        if let Ok(file) = parse(&text, "p.json") {
            if let Ok(model) = PerfModel::new(&file, 0.1, "p.json") {
                let _ = solve(&model, gpus, &SolveOptions::default());
            }
        }
    }

    /// A damaged colocation file loads or is refused.
    #[test]
    fn damaged_colocations_never_panic(ms in prop::collection::vec(mutation(), 1..4)) {
        let _ = parse_colocations(&damage(&colocations(), &ms), "c.json");
    }

    /// A damaged plan loads or is refused, naming the file; what loads resolves against the
    /// model or is refused naming the field.
    #[test]
    fn damaged_plans_never_panic(ms in prop::collection::vec(mutation(), 1..4)) {
        let graph = ModuleGraph {
            model: "model m".into(),
            names: vec!["a".into(), "b".into(), "head".into()],
            producers: vec![vec![], vec![], vec![0, 1]],
        };
        match parse_plan(&damage(&plan(), &ms), "plan.json") {
            Ok(p) => {
                if let Err(e) = p.resolve(Path::new("plan.json"), &graph) {
                    prop_assert!(e.to_string().starts_with("plan.json: field `"), "{}", e);
                }
            }
            Err(e) => prop_assert!(e.to_string().starts_with("plan.json: "), "{}", e),
        }
    }
}
