//! Planner (in progress).
