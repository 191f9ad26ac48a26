//! Summaries of the runs ([`ModeSummary`]: what the table prints and the JSON holds,
//! in `summary`), the terminal table ([`table`]), and the plots ([`plot`]).

mod summary;
mod table;

pub mod plot;

pub use self::summary::{
    BreakdownMs, BucketSummary, LookupSummary, ModeSummary, Percentiles, Report, WaitSummary,
    same_as, summarise,
};
pub use self::table::{labelled, table};
