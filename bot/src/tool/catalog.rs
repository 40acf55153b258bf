//! The tool catalog. (Being written.)
