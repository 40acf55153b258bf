//! Built-in toolsets. (Being written.)
