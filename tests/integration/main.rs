//! One integration test binary (links once): golden compile/link tests, round trips, loomc end to end, sandbox.

mod codec_conformance;
mod golden_compile;
mod golden_link;
mod hal_conformance;
mod hal_motifs;
mod pipeline_props;
mod vm_sandbox;
