//! Built-in zoo (in progress).
