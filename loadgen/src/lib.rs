//! loadgen: the 24-phase routing matrix, live, local and simulated.
