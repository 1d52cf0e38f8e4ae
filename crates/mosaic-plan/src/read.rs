//! Reading a `mosaic-plan/1` file, the one way every consumer reads a plan: [`load_plan`]
//! parses it with field-path errors, and [`Plan::resolve`] checks it against the model it runs
//! (every module placed exactly once, producers in earlier stages, `dp` equal to the number of
//! its GPUs, distinct GPUs of the pool, quotas in (0, 1] adding up to at most a whole GPU, and
//! `nodes`, where listed, shaped like the nodes of its GPUs) and turns module names into
//! indices. The simulator and the engine then check only what is theirs (a cluster's device,
//! memory and node size — [`Plan::check_nodes`] — and a batch size).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mosaic_profile::PerfModel;

use crate::error::PlanFileError;
use crate::plan::{Plan, PlanModule, PLAN_FORMAT};

/// Reads and parses a `mosaic-plan/1` file; errors name the file and the field.
pub fn load_plan(path: impl AsRef<Path>) -> Result<Plan, PlanFileError> {
    let path = path.as_ref();
    let text =
        mosaic_kit::files::read_text(path, mosaic_kit::files::MAX_TEXT_BYTES).map_err(|error| {
            PlanFileError::Io {
                file: path.to_path_buf(),
                error,
            }
        })?;
    parse_plan(&text, path)
}

/// Parses a `mosaic-plan/1` file's text; `file` names it in errors. The `format` field is
/// checked first, so that a file of another kind gets that error rather than a complaint
/// about its fields.
pub fn parse_plan(text: &str, file: impl AsRef<Path>) -> Result<Plan, PlanFileError> {
    let file = file.as_ref();
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(text) {
        let found = match map.get("format") {
            Some(serde_json::Value::String(f)) if f == PLAN_FORMAT => None,
            Some(other) => Some(other.to_string()),
            None => Some("no format field".into()),
        };
        if let Some(found) = found {
            return Err(PlanFileError::Format {
                file: file.to_path_buf(),
                found,
            });
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let plan: Plan = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let field = e.path().to_string();
        PlanFileError::Syntax {
            file: file.to_path_buf(),
            field: if field == "." { "(file)".into() } else { field },
            message: e.into_inner().to_string(),
        }
    })?;
    de.end().map_err(|e| PlanFileError::Syntax {
        file: file.to_path_buf(),
        field: "(file)".into(),
        message: format!("{e}; expected nothing but whitespace after the plan's JSON object"),
    })?;
    check_search(&plan, file)?;
    Ok(plan)
}

/// The values of `search` the tools write: `mosaic plan`'s searches (`gahc`, `local`,
/// `exact`), `mosaic compare`'s Megatron-LM baseline, the engine's sequential template
/// (`mosaic train template`), and `hand` for a plan written by hand.
const SEARCHES: [&str; 6] = [
    "gahc",
    "local",
    "exact",
    "megatron-lm",
    "sequential",
    "hand",
];

/// A plan file's `search` is one of [`SEARCHES`].
fn check_search(plan: &Plan, file: &Path) -> Result<(), PlanFileError> {
    if SEARCHES.contains(&plan.search.as_str()) {
        return Ok(());
    }
    Err(PlanFileError::BadField {
        file: file.to_path_buf(),
        field: "search".into(),
        message: format!(
            "\"{}\" is no search the tools write; expected one of {}",
            mosaic_kit::text::name(&plan.search),
            SEARCHES.map(|s| format!("\"{s}\"")).join(", ")
        ),
    })
}

/// The modules a plan is resolved against: their names in model order and each one's direct
/// producers (indices into `names`).
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleGraph {
    /// The model as errors name it: `model ofasys`, `engine model clip-tiny`.
    pub model: String,
    /// Module names, in model order.
    pub names: Vec<String>,
    /// Per module, the modules it consumes.
    pub producers: Vec<Vec<usize>>,
}

impl ModuleGraph {
    /// The graph of a performance model's modules (named `the profiled model` in errors).
    pub fn of(model: &PerfModel) -> ModuleGraph {
        ModuleGraph {
            model: "the profiled model".into(),
            names: model.modules.iter().map(|m| m.name.clone()).collect(),
            producers: model
                .modules
                .iter()
                .map(|m| m.parents.iter().collect())
                .collect(),
        }
    }

    fn index_of(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }
}

/// One module of a stage, resolved: what the simulator and the engine execute.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// Index into [`ModuleGraph::names`].
    pub module: usize,
    /// Data-parallel degree: the number of `gpus`.
    pub dp: u32,
    /// SM quota on each of its GPUs, in (0, 1].
    pub sm: f64,
    /// The distinct GPUs of the pool holding its replicas, replica `k` on `gpus[k]`.
    pub gpus: Vec<u32>,
}

impl Plan {
    /// Checks the plan (read from `file`, which errors name) against `graph` and resolves its
    /// modules to indices: one list of assignments per stage, in the plan's order (an empty
    /// stage stays empty). The first violation is returned, naming the field.
    pub fn resolve(
        &self,
        file: &Path,
        graph: &ModuleGraph,
    ) -> Result<Vec<Vec<Assignment>>, PlanFileError> {
        if self.format != PLAN_FORMAT {
            return Err(PlanFileError::Format {
                file: file.to_path_buf(),
                found: format!("\"{}\"", self.format),
            });
        }
        if self.gpus == 0 || self.gpus > crate::MAX_GPUS {
            return Err(PlanFileError::PoolSize {
                file: file.to_path_buf(),
                gpus: self.gpus,
            });
        }
        check_numbers(self, file)?;
        let mut r = Resolver {
            file,
            graph,
            pool: self.gpus,
            placed: HashMap::new(),
        };
        let stages = self
            .stages
            .iter()
            .enumerate()
            .map(|(si, s)| r.stage(si, &s.modules))
            .collect::<Result<Vec<_>, _>>()?;
        r.check_complete()?;
        r.check_order()?;
        check_sms(self, file)?;
        Ok(stages)
    }

    /// Checks the plan against the performance model it was made from: the rules of
    /// [`Plan::resolve`], and the planned memory (`mem_gib`) within the device on every GPU.
    /// Returns the first violation found.
    pub fn check(&self, model: &PerfModel) -> Result<(), String> {
        let file = Path::new("plan");
        let stages = self
            .resolve(file, &ModuleGraph::of(model))
            .map_err(|e| e.to_string())?;
        self.check_nodes(file, model.nodes.map(|n| n.gpus_per_node))
            .map_err(|e| e.to_string())?;
        for (si, (stage, planned)) in stages.iter().zip(&self.stages).enumerate() {
            let mut mem = vec![0.0; self.gpus as usize];
            for (a, m) in stage.iter().zip(&planned.modules) {
                for &g in &a.gpus {
                    mem[g as usize] += m.mem_gib;
                }
            }
            if let Some(g) = (0..mem.len()).find(|&g| mem[g] > model.device.memory_gib + 1e-3) {
                return Err(format!(
                    "stage {si}: GPU {g} needs {:.2} GiB > {}",
                    mem[g], model.device.memory_gib
                ));
            }
        }
        Ok(())
    }
}

impl Plan {
    /// Checks every module's `nodes` (read from `file`, which errors name) against the node
    /// size of what runs the plan: with `Some(gpus_per_node)`, a module that lists nodes must
    /// list exactly those its GPUs lie on ([`crate::nodes::nodes_of`]); with `None` (one node,
    /// no node information), none may list any. A module listing none is always accepted (a
    /// plan made without node information).
    pub fn check_nodes(
        &self,
        file: &Path,
        gpus_per_node: Option<u32>,
    ) -> Result<(), PlanFileError> {
        for (si, s) in self.stages.iter().enumerate() {
            for (mi, m) in s.modules.iter().enumerate() {
                if m.nodes.is_empty() {
                    continue;
                }
                let message = match gpus_per_node {
                    Some(gpn) => {
                        let want = crate::nodes::nodes_of(&m.gpus, gpn);
                        if want == m.nodes {
                            continue;
                        }
                        format!(
                            "{:?}, but GPUs {:?} lie on nodes {want:?} ({gpn} GPUs per node)",
                            m.nodes, m.gpus
                        )
                    }
                    None => format!(
                        "{:?}, but the pool it runs on is one node (its profile has no `nodes`)",
                        m.nodes
                    ),
                };
                return Err(PlanFileError::BadNodes {
                    file: file.to_path_buf(),
                    field: format!("stages[{si}].modules[{mi}].nodes"),
                    message,
                });
            }
        }
        Ok(())
    }
}

/// The largest time a plan may state, in ms (about 30,000 years an iteration): above what any
/// valid profile plans to (64 stages of 10⁷ ms samples slowed by the largest interference stay
/// below 5·10¹² ms), so every plan the planner writes reads back.
const MAX_TIME_MS: f64 = 1e15;
/// The largest memory a plan may state per GPU, in GiB.
const MAX_MEM_GIB: f64 = 1e6;

/// Every time, memory and per-GPU quota figure of the plan is a finite number in its range, so
/// that sums over the plan stay finite (an infinite total would be written as `null`).
fn check_numbers(plan: &Plan, file: &Path) -> Result<(), PlanFileError> {
    let check = |field: String, value: f64, max: f64| {
        if (0.0..=max).contains(&value) {
            Ok(())
        } else {
            Err(PlanFileError::BadNumber {
                file: file.to_path_buf(),
                field,
                value,
                max,
            })
        }
    };
    check("iteration_ms".into(), plan.iteration_ms, MAX_TIME_MS)?;
    check("solve_ms".into(), plan.solve_ms, MAX_TIME_MS)?;
    if let Some(bound) = plan.lower_bound_ms {
        check("lower_bound_ms".into(), bound, MAX_TIME_MS)?;
    }
    let g = plan.granularity;
    let finest = 1.0 / mosaic_profile::MAX_QUOTA_UNITS as f64;
    if !(g >= finest - 1e-12 && g <= 1.0) {
        return Err(PlanFileError::BadField {
            file: file.to_path_buf(),
            field: "granularity".into(),
            message: format!(
                "{g:?} is no quota step; expected a fraction of a GPU from 1/{} to 1",
                mosaic_profile::MAX_QUOTA_UNITS
            ),
        });
    }
    for (si, s) in plan.stages.iter().enumerate() {
        check(format!("stages[{si}].time_ms"), s.time_ms, MAX_TIME_MS)?;
        for (g, &q) in s.gpu_quota.iter().enumerate() {
            check(format!("stages[{si}].gpu_quota[{g}]"), q, 1.0 + 1e-6)?;
        }
        for (mi, m) in s.modules.iter().enumerate() {
            let at = format!("stages[{si}].modules[{mi}]");
            check(format!("{at}.time_ms"), m.time_ms, MAX_TIME_MS)?;
            check(format!("{at}.base_ms"), m.base_ms, MAX_TIME_MS)?;
            check(format!("{at}.mem_gib"), m.mem_gib, MAX_MEM_GIB)?;
        }
    }
    Ok(())
}

/// With an `sm_count`, checks it (1 to [`mosaic_profile::MAX_QUOTA_UNITS`] SMs) and that every
/// module's quota is a whole number of those SMs, as the planner writes them on a device with
/// a partition rule.
fn check_sms(plan: &Plan, file: &Path) -> Result<(), PlanFileError> {
    let Some(n) = plan.sm_count else {
        return Ok(());
    };
    let bad = |field: String, message: String| PlanFileError::BadSms {
        file: file.to_path_buf(),
        field,
        message,
    };
    if n == 0 || n > mosaic_profile::MAX_QUOTA_UNITS {
        return Err(bad(
            "sm_count".into(),
            format!(
                "a GPU has 1 to {} SMs, found {n}",
                mosaic_profile::MAX_QUOTA_UNITS
            ),
        ));
    }
    for (si, s) in plan.stages.iter().enumerate() {
        for (mi, m) in s.modules.iter().enumerate() {
            if mosaic_profile::quota_to_sms(m.sm, n).is_none() {
                return Err(bad(
                    format!("stages[{si}].modules[{mi}].sm"),
                    format!(
                        "{} is {:.3} SMs; with `sm_count` {n} a quota is a whole number of SMs \
                         over it (k/{n}, within {})",
                        m.sm,
                        m.sm * n as f64,
                        mosaic_profile::SM_QUOTA_TOLERANCE
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The state of one resolution: where each module was placed so far.
struct Resolver<'a> {
    file: &'a Path,
    graph: &'a ModuleGraph,
    pool: u32,
    /// Module index -> (stage, the field of its name).
    placed: HashMap<usize, (usize, String)>,
}

impl Resolver<'_> {
    fn file(&self) -> PathBuf {
        self.file.to_path_buf()
    }

    /// Resolves stage `si`, summing the quotas on each GPU as its modules are placed.
    fn stage(
        &mut self,
        si: usize,
        modules: &[PlanModule],
    ) -> Result<Vec<Assignment>, PlanFileError> {
        let mut quota = vec![0.0; self.pool as usize];
        modules
            .iter()
            .enumerate()
            .map(|(mi, m)| self.module(si, &format!("stages[{si}].modules[{mi}]"), m, &mut quota))
            .collect()
    }

    /// Resolves one module placed at `at`: its name, quota, GPUs and dp.
    fn module(
        &mut self,
        si: usize,
        at: &str,
        m: &PlanModule,
        quota: &mut [f64],
    ) -> Result<Assignment, PlanFileError> {
        let module = self.name(si, at, &m.name)?;
        if !(m.sm >= crate::MIN_QUOTA && m.sm <= 1.0) {
            return Err(PlanFileError::BadQuota {
                file: self.file(),
                field: format!("{at}.sm"),
                sm: m.sm,
            });
        }
        self.gpus(at, m, quota)?;
        if m.dp == 0 || m.dp as usize != m.gpus.len() {
            return Err(PlanFileError::DpMismatch {
                file: self.file(),
                field: format!("{at}.dp"),
                dp: m.dp,
                gpus: m.gpus.len(),
            });
        }
        self.nodes(at, m)?;
        Ok(Assignment {
            module,
            dp: m.dp,
            sm: m.sm,
            gpus: m.gpus.clone(),
        })
    }

    /// The index of the module called `name`, placed for the first time, in stage `si`.
    fn name(&mut self, si: usize, at: &str, name: &str) -> Result<usize, PlanFileError> {
        let field = format!("{at}.name");
        let module = self
            .graph
            .index_of(name)
            .ok_or_else(|| PlanFileError::UnknownModule {
                file: self.file(),
                field: field.clone(),
                name: name.to_string(),
                model: self.graph.model.clone(),
                known: self
                    .graph
                    .names
                    .iter()
                    .map(|n| mosaic_kit::text::name(n))
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        if let Some((_, first)) = self.placed.get(&module) {
            return Err(PlanFileError::DuplicateModule {
                file: self.file(),
                field,
                name: name.to_string(),
                first: first.clone(),
            });
        }
        self.placed.insert(module, (si, field));
        Ok(module)
    }

    /// Checks a module's GPUs: in the pool, distinct, and not filled past a whole GPU.
    fn gpus(&self, at: &str, m: &PlanModule, quota: &mut [f64]) -> Result<(), PlanFileError> {
        for (k, &gpu) in m.gpus.iter().enumerate() {
            let field = format!("{at}.gpus[{k}]");
            if gpu >= self.pool {
                return Err(PlanFileError::GpuOutOfRange {
                    file: self.file(),
                    field,
                    gpu,
                    pool: self.pool,
                });
            }
            if m.gpus[..k].contains(&gpu) {
                return Err(PlanFileError::RepeatedGpu {
                    file: self.file(),
                    field,
                    gpu,
                });
            }
            quota[gpu as usize] += m.sm;
            if quota[gpu as usize] > 1.0 + 1e-6 {
                return Err(PlanFileError::Oversubscribed {
                    file: self.file(),
                    field,
                    gpu,
                    quota: quota[gpu as usize],
                });
            }
        }
        Ok(())
    }

    /// Checks the shape of a module's `nodes`, whatever the node size: ascending and distinct,
    /// no more than its GPUs, none past its last GPU's number (a node holds at least one GPU).
    /// [`Plan::check_nodes`] checks them against a node size.
    fn nodes(&self, at: &str, m: &PlanModule) -> Result<(), PlanFileError> {
        let last = m.gpus.iter().copied().max().unwrap_or(0);
        let ascending = m.nodes.windows(2).all(|w| w[0] < w[1]);
        if ascending && m.nodes.len() <= m.gpus.len() && m.nodes.iter().all(|&n| n <= last) {
            return Ok(());
        }
        Err(PlanFileError::BadNodes {
            file: self.file(),
            field: format!("{at}.nodes"),
            message: format!(
                "{:?} are not the nodes of GPUs {:?}: expected distinct node numbers, ascending, \
                 at most one per GPU and none above the largest GPU number",
                m.nodes, m.gpus
            ),
        })
    }

    /// Every module of the graph is placed.
    fn check_complete(&self) -> Result<(), PlanFileError> {
        match (0..self.graph.names.len()).find(|i| !self.placed.contains_key(i)) {
            Some(m) => Err(PlanFileError::MissingModule {
                file: self.file(),
                name: self.graph.names[m].clone(),
                model: self.graph.model.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Every module runs in a later stage than each of its producers.
    fn check_order(&self) -> Result<(), PlanFileError> {
        for (i, producers) in self.graph.producers.iter().enumerate() {
            let (stage, field) = &self.placed[&i];
            for &p in producers {
                let producer_stage = self.placed[&p].0;
                if producer_stage >= *stage {
                    return Err(PlanFileError::Order {
                        file: self.file(),
                        field: field.clone(),
                        name: self.graph.names[i].clone(),
                        stage: *stage,
                        producer: self.graph.names[p].clone(),
                        producer_stage,
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-module plan on one GPU, as the planner writes it.
    fn valid() -> serde_json::Value {
        serde_json::json!({
            "format": "mosaic-plan/1", "iteration_ms": 10.0, "search": "gahc", "optimal": true,
            "lower_bound_ms": 10.0, "solve_ms": 0.5, "gpus": 1, "device": "gpu",
            "granularity": 0.1,
            "stages": [{"time_ms": 10.0, "gpu_quota": [1.0], "modules": [
                {"name": "a", "dp": 1, "sm": 1.0, "gpus": [0], "time_ms": 10.0,
                 "base_ms": 10.0, "mem_gib": 1.0}]}]
        })
    }

    fn graph() -> ModuleGraph {
        ModuleGraph {
            model: "model m".into(),
            names: vec!["a".into()],
            producers: vec![vec![]],
        }
    }

    /// Parses and resolves `v` as the file `p.json`.
    fn read(v: &serde_json::Value) -> Result<(), PlanFileError> {
        let plan = parse_plan(&v.to_string(), "p.json")?;
        plan.resolve(Path::new("p.json"), &graph()).map(|_| ())
    }

    #[test]
    fn the_valid_plan_reads() {
        read(&valid()).unwrap();
    }

    #[test]
    fn text_after_the_json_value_is_refused() {
        let text = valid().to_string();
        for tail in ["not json at all", "{}", "]", "0"] {
            let e = parse_plan(&format!("{text}\n{tail}\n"), "p.json").unwrap_err();
            assert!(matches!(e, PlanFileError::Syntax { .. }), "{e}");
            let message = e.to_string();
            assert!(
                message.starts_with("p.json: field `(file)`: trailing characters"),
                "{e}"
            );
        }
        // Whitespace is no text.
        parse_plan(&format!("{text} \n\t\r\n"), "p.json").unwrap();
    }

    #[test]
    fn fields_the_resolver_used_to_pass_unread_are_checked() {
        let cases: [(&str, serde_json::Value); 9] = [
            ("granularity", 0.into()),
            ("granularity", (-1).into()),
            ("granularity", 1e308.into()),
            ("granularity", 1.0001.into()),
            ("granularity", 1e-5.into()),
            ("lower_bound_ms", (-1).into()),
            ("lower_bound_ms", (-1e300).into()),
            ("lower_bound_ms", 1e300.into()),
            ("search", "magic".into()),
        ];
        for (field, value) in cases {
            let mut v = valid();
            v[field] = value.clone();
            let e = read(&v).expect_err(&format!("{field} = {value}"));
            assert_eq!(e.field(), Some(field), "{e}");
            assert!(e.to_string().starts_with("p.json: field"), "{e}");
        }
        for search in SEARCHES {
            let mut v = valid();
            v["search"] = search.into();
            read(&v).unwrap();
        }
        let mut v = valid();
        v.as_object_mut().unwrap().remove("lower_bound_ms");
        v["granularity"] = (8.0 / 132.0).into();
        read(&v).unwrap();
    }

    #[test]
    fn a_huge_name_is_quoted_clipped() {
        let mut v = valid();
        v["stages"][0]["modules"][0]["name"] = "n".repeat(1_000_000).into();
        let e = read(&v).unwrap_err().to_string();
        assert!(e.contains("(1000000 characters in all)"), "{e}");
        assert!(e.len() < 300, "{e}");
        let mut v = valid();
        v["search"] = "s".repeat(1_000_000).into();
        assert!(read(&v).unwrap_err().to_string().len() < 400);
        // The parser's own message echoes a string found where a number belongs.
        let mut v = valid();
        v["gpus"] = "g".repeat(1_000_000).into();
        let e = read(&v).unwrap_err().to_string();
        assert!(e.contains("field `gpus`") && e.contains("left out"), "{e}");
        assert!(e.len() < 1_200, "{}", e.len());
    }
}
