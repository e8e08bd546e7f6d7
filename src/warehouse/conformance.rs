//! Checks every warehouse passes.
