//! `mosaic plan`: profiles in, a temporal-spatial plan out.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use mosaic_plan::render::plan_table;
use mosaic_plan::{solve, Search, SolveOptions};

use crate::input::Source;

/// Arguments of `mosaic plan`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    source: Source,
    /// Stage search: the paper's GAHC alone; or GAHC, local moves, then the exact search
    /// until it proves the optimum (`exact`), or only where it may finish (`auto`).
    #[arg(long, value_enum, default_value_t = SearchArg::Auto)]
    search: SearchArg,
    /// Deadline in milliseconds: the plan returned is the best found by then, with what was
    /// proven about it (optimal, or within x % of a lower bound).
    #[arg(long, default_value_t = 2000)]
    time_budget: u64,
    /// Print the plan as mosaic-plan/1 JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write the plan as mosaic-plan/1 JSON to this file.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The `--search` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum SearchArg {
    Gahc,
    Exact,
    Auto,
}

/// Runs `mosaic plan`.
pub fn run(args: Args) -> Result<()> {
    crate::input::check_outputs(
        &[("--out", args.out.as_deref())],
        &[("--profiles", args.source.profiles.as_deref())],
    )?;
    let input = args.source.load()?;
    let search = match args.search {
        SearchArg::Gahc => Search::Gahc,
        SearchArg::Exact => Search::Exact,
        SearchArg::Auto => Search::Auto,
    };
    let opts = SolveOptions {
        search,
        budget: Duration::from_millis(args.time_budget),
    };
    let mut plan = solve(&input.model, input.gpus, &opts).map_err(|e| {
        // A module that fits no GPU is the profile's fault; a pool size is the flag's alone.
        let field = match &e {
            mosaic_plan::PlanError::Unplaceable { module, .. } => input
                .model
                .index_of(module)
                .map(|i| format!(": field `modules[{i}].samples`")),
            _ => None,
        };
        match field {
            Some(field) => {
                anyhow::Error::from(e).context(format!("{}{field}: no plan", input.name))
            }
            None => anyhow::Error::from(e),
        }
    })?;
    plan.model = input.zoo_model.clone();
    plan.cluster = input.cluster.clone();
    let json = serde_json::to_string_pretty(&plan)? + "\n";
    if let Some(out) = &args.out {
        std::fs::write(out, &json).with_context(|| format!("cannot write {}", out.display()))?;
    }
    if args.json {
        print!("{json}");
    } else {
        print!("{}", plan_table(&plan, &input.label));
    }
    Ok(())
}
