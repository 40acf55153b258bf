//! Readiness of the daemon's parts, for `/readyz`: each named component (an adapter, the
//! store) says whether it can do its work and, if not, why. Process-wide, because the
//! adapters that set it and the HTTP listener that reads it are wired far apart.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock, PoisonError};

/// Named components and their state: `None` when ready, `Some(reason)` when not.
#[derive(Debug, Default)]
pub struct Health {
    components: Mutex<BTreeMap<String, Option<String>>>,
}

impl Health {
    /// Marks `component` as working.
    pub fn set_ready(&self, component: &str) {
        self.set(component, None);
    }

    /// Marks `component` as not working, with a reason an operator can act on.
    pub fn set_down(&self, component: &str, reason: impl Into<String>) {
        self.set(component, Some(reason.into()));
    }

    /// Forgets `component` (it is no longer configured).
    pub fn remove(&self, component: &str) {
        self.lock().remove(component);
    }

    /// `Ok(())` when every registered component is ready, else the ones that are not.
    pub fn check(&self) -> Result<(), NotReady> {
        let reasons: Vec<String> = self
            .lock()
            .iter()
            .filter_map(|(name, state)| state.as_ref().map(|why| format!("{name}: {why}")))
            .collect();
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(NotReady(reasons))
        }
    }

    fn set(&self, component: &str, state: Option<String>) {
        self.lock().insert(component.to_owned(), state);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Option<String>>> {
        // A panic while holding the map leaves it whole (single inserts), so poison is moot.
        self.components
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The components that are not ready, as `name: reason`; shown one per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.join("\n"))]
pub struct NotReady(pub Vec<String>);

/// The process's readiness registry.
pub fn global() -> &'static Health {
    static HEALTH: OnceLock<Health> = OnceLock::new();
    HEALTH.get_or_init(Health::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn down_components_are_named_until_ready() {
        let health = Health::default();
        assert_eq!(health.check(), Ok(()));
        health.set_down("telegram", "polling failed");
        health.set_ready("store");
        let down = health.check().expect_err("telegram is down");
        assert_eq!(down.to_string(), "telegram: polling failed");
        health.set_ready("telegram");
        assert_eq!(health.check(), Ok(()));
    }
}
