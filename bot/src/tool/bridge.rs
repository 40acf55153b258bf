//! Typed async functions as tools. (Being written; see the tool helper.)

/// A toolset made of typed functions.
pub struct ToolSetBridge {}
/// Builds a [`ToolSetBridge`].
pub struct ToolSetBridgeBuilder {}
