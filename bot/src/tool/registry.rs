//! The registry. (Being written.)

/// Registry errors.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {}
/// The registry.
pub struct ToolRegistry {}
