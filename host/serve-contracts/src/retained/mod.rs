//! Retained text (issue 16, in progress): the server-owned parts of the contract that do not depend on the
//! package ABI: sampling ([`sampling`]), incremental text with stop strings ([`text`]), and paged state
//! ([`pages`]). The contract itself (the package's epoch entries, the scheduler that packs prompt chunks and
//! decode anchors, the routes) is not built yet; these pieces are what it will drive, each tested against an
//! independent definition.

pub mod chat;
pub mod pages;
pub mod sampling;
pub mod text;
