//! Where the budget controller's learned state lives between requests.

use std::sync::{Arc, Mutex};

use crate::budget::AutoBudget;
use crate::cost::CostCurve;

/// The budget controller's learned state that outlives a request.
#[derive(Clone, Debug, Default)]
pub struct BudgetState {
    pub auto: Option<AutoBudget>,
    pub cost: Option<CostCurve>,
}

/// A home for the budget's calibration (the acceptance table and the online cost curve):
/// one per drafter, or one per memory scope. A session starts from a copy and writes its
/// state back when it finishes (the last request to finish wins).
#[derive(Clone, Debug, Default)]
pub struct Calibration(Arc<Mutex<Option<BudgetState>>>);

impl Calibration {
    pub fn get(&self) -> Option<BudgetState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn put(&self, auto: Option<AutoBudget>, cost: Option<CostCurve>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(BudgetState { auto, cost });
    }

    pub fn clear(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    pub fn is_set(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}
