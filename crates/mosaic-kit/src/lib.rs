//! Small pieces every step of the pipeline shares, so that the planner, the simulator, the fit,
//! the engine and the command line do not each carry their own copy: a seeded random
//! generator whose sequences never change ([`rng`]), robust statistics ([`stats`]), a
//! writer of standalone SVG documents ([`svg`]), guarded reading of users' files
//! ([`files`]) and quoting their text in messages without echoing all of it ([`text`]). It
//! depends on nothing but the standard library.
//!
//! ```
//! use mosaic_kit::{rng::SplitMix64, stats::median, svg::Svg};
//!
//! // The same seed, the same draws.
//! let mut rng = SplitMix64::new(7);
//! let xs: Vec<f64> = (0..5).map(|_| rng.uniform(1.0, 2.0)).collect();
//! assert_eq!(xs[0], SplitMix64::new(7).uniform(1.0, 2.0));
//!
//! // A robust summary of the draws.
//! let m = median(&xs).unwrap();
//! assert!((1.0..2.0).contains(&m));
//!
//! // And a picture of them.
//! let mut doc = Svg::new(200.0, 100.0, "sans-serif", 11.0);
//! for (i, &x) in xs.iter().enumerate() {
//!     doc.circle(20.0 + 40.0 * i as f64, 100.0 * (2.0 - x), 3.0).end();
//! }
//! doc.text(100.0, 12.0).attr("text-anchor", "middle").content("draws <1, 2>");
//! let svg = doc.finish();
//! assert!(svg.starts_with("<svg") && svg.contains("draws &lt;1, 2&gt;"));
//! assert_eq!(svg.matches("<circle").count(), 5);
//! ```

#![warn(missing_docs)]

pub mod files;
pub mod rng;
pub mod stats;
pub mod svg;
pub mod text;
