//! Argument validation. (Being written; see the tool helper.)
