"""Fitted coefficients shipped with lcmoe (written by the scripts in benchmarks/)."""
