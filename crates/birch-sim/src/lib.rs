//! birch-sim: simulation testing for the birch engine.
//!
//! - [`model`]: an in-memory reference filesystem with kernel semantics
//!   (errno for errno), and the canonical [`model::View`] both sides are
//!   compared in;
//! - [`extract`]: the same view read out of a live `Filesystem`;
//! - [`workload`]: seeded random op sequences over a small pool of names;
//! - [`exec`]: the one executor of ops, shared by model, engine and host;
//! - [`harness`]: runs ops on engine and model together and compares;
//! - [`ace`]: CrashMonkey/ACE-style seq-1 and seq-2 workloads;
//! - [`crash`]: records a workload on a `RecordingDevice` and checks every
//!   crash state it can leave against the oracles.
//!
//! docs/CRASH-TESTING.md describes the media model, the enumeration and
//! the oracles.

pub mod ace;
pub mod crash;
pub mod exec;
pub mod extract;
pub mod harness;
pub mod model;
pub mod overlay;
pub mod runner;
pub mod workload;
