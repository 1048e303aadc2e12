//! RECAP's settings, one source of truth: the defaults and limits Python's `RecapConfig`
//! shows come from `recap_core`, and its validation is `RecapConfig::validate` here.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use recap_core::DEFAULT_ETA;
use recap_core::{Error, FusionMode, Priors, RecapConfig, SearchParams, SharedMemory};

use crate::errors::to_py;

pub fn nonneg(name: &'static str, v: i64) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| to_py(Error::invalid(name, "a value >= 0", v)))
}

/// The settings Python passes, as one struct (every field already has its default).
pub struct Knobs<'a> {
    pub k: i64,
    pub budget: i64,
    pub max_depth: i64,
    pub eta: Option<Vec<f32>>,
    pub priors: (f32, f32, f32),
    pub fusion: &'a str,
    pub suffix_len: i64,
    pub suffix_adaptive: bool,
    pub context_capacity: i64,
    pub seed_context: bool,
    pub reset_memory: bool,
    pub frequency: bool,
    pub frequency_floor: bool,
}

impl Knobs<'_> {
    /// The core config, validated.
    pub fn build(&self) -> PyResult<RecapConfig> {
        let max_depth = nonneg("max_depth", self.max_depth)?;
        let config = RecapConfig {
            k: nonneg("k", self.k)?,
            search: SearchParams {
                budget: nonneg("budget", self.budget)?,
                max_depth: u32::try_from(max_depth).unwrap_or(u32::MAX),
                eta: self.eta.clone().unwrap_or_else(|| DEFAULT_ETA.to_vec()),
            },
            priors: Priors {
                g: self.priors.0,
                c: self.priors.1,
                u: self.priors.2,
            },
            fusion: FusionMode::parse(self.fusion).map_err(to_py)?,
            suffix_len: nonneg("suffix_len", self.suffix_len)?,
            suffix_adaptive: self.suffix_adaptive,
            context_capacity: nonneg("context_capacity", self.context_capacity)?,
            seed_context: self.seed_context,
            reset_unigram: self.reset_memory,
            frequency: self.frequency,
            frequency_floor: self.frequency_floor,
        };
        config.validate().map_err(to_py)?;
        Ok(config)
    }
}

/// Defaults and limits of every RECAP setting, as a dict.
#[pyfunction]
fn recap_defaults(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let c = RecapConfig::default();
    let d = PyDict::new(py);
    d.set_item("k", c.k)?;
    d.set_item("max_budget", c.search.budget)?;
    d.set_item("max_depth", c.search.max_depth)?;
    d.set_item("eta", c.search.eta.clone())?;
    d.set_item("priors", (c.priors.g, c.priors.c, c.priors.u))?;
    d.set_item("fusion", c.fusion.name())?;
    d.set_item("fusion_modes", FusionMode::NAMES.to_vec())?;
    d.set_item("suffix_len", c.suffix_len)?;
    d.set_item("auto_suffix_cap", RecapConfig::AUTO_SUFFIX_CAP)?;
    d.set_item("context_capacity", c.context_capacity)?;
    d.set_item("memory_capacity", SharedMemory::DEFAULT_CAPACITY)?;
    d.set_item("max_k", RecapConfig::MAX_K)?;
    d.set_item("max_budget_limit", SearchParams::MAX_BUDGET)?;
    d.set_item("max_depth_limit", SearchParams::MAX_DEPTH)?;
    d.set_item("max_suffix", RecapConfig::MAX_SUFFIX)?;
    Ok(d)
}

/// Validates RECAP settings exactly as a drafter built from them would; raises ValueError
/// naming the setting, what was expected and what was got.
#[pyfunction]
#[pyo3(signature = (*, k, budget, max_budget, max_depth, eta, priors, fusion, suffix_len,
    context_capacity, memory_capacity))]
#[allow(clippy::too_many_arguments)]
fn check_recap_config(
    k: i64,
    budget: i64,
    max_budget: i64,
    max_depth: i64,
    eta: Vec<f32>,
    priors: (f32, f32, f32),
    fusion: &str,
    suffix_len: i64,
    context_capacity: i64,
    memory_capacity: i64,
) -> PyResult<()> {
    SearchParams::check_budget("max_budget", nonneg("max_budget", max_budget)?).map_err(to_py)?;
    Knobs {
        k,
        budget,
        max_depth,
        eta: Some(eta),
        priors,
        fusion,
        suffix_len,
        suffix_adaptive: false,
        context_capacity,
        seed_context: false,
        reset_memory: false,
        frequency: false,
        frequency_floor: false,
    }
    .build()?;
    if memory_capacity < 1 {
        return Err(to_py(Error::invalid(
            "memory_capacity",
            ">= 1",
            memory_capacity,
        )));
    }
    Ok(())
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(recap_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(check_recap_config, m)?)?;
    Ok(())
}
