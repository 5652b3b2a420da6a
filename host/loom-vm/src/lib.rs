//! `loom-vm`: placeholder until the VM lands.
