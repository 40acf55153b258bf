//! The agent loop. (Being written.)
