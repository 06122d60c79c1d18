//! (being written: see mod.rs for the plan)
