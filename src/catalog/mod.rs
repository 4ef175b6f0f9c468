//! The metrics catalog: which series to export, read from dcgm-exporter's metrics CSV.
//!
//! `load(path)` reads a file and hands it to the pure [`parse`]; the result is a [`Catalog`] of
//! numeric metrics (in file order, which is also the exposition order) and label rows (sorted by
//! name, as dcgm-exporter attaches them).

pub mod field;
mod gocsv;
mod model;
mod parse;

use std::path::Path;

use crate::fsread::{self, Cap, Symlinks};

pub use field::Field;
pub use model::{Catalog, CatalogError, Defect, MetricSpec, MetricType, Skipped};
pub use parse::parse;

/// Reads a metrics CSV file's text through the bounded reader: a regular file (links are
/// followed: a ConfigMap mount is a tree of links) of at most [`Cap::METRICS_CSV`] bytes.
///
/// # Errors
/// [`CatalogError::Read`], naming the path (and the line, for text that is not UTF-8).
pub fn read(path: &Path) -> Result<String, CatalogError> {
    fsread::read_text(path, Cap::METRICS_CSV, Symlinks::Follow).map_err(CatalogError::Read)
}

/// Reads and parses a metrics CSV file.
///
/// # Errors
/// [`CatalogError::Read`] if the file cannot be read, [`CatalogError::Invalid`] for a bad row,
/// [`CatalogError::Empty`] if it lists no metric.
pub fn load(path: &Path) -> Result<(Catalog, Vec<Skipped>), CatalogError> {
    parse(&read(path)?, &path.display().to_string())
}
