//! Reports: what turns run records into something to read. [`console`]: the tables `bench`
//! prints.

pub mod console;
