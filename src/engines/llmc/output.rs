//! llm.c's stdout parsed line by line: the parser is the leaf [`crate::llmc_output`], which
//! `extract-metrics` reads llm.c's saved logs with too.

pub use crate::llmc_output::*;
