//! What a sample's columns decode to, for every format with columns (MDS, Parquet).

use bytes::Bytes;

/// A column's value: MDS's encodings, Parquet's types.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Bytes(Bytes),
    /// MDS `json`: the JSON text.
    Json(String),
    /// MDS `pkl`: a pickle, unpickled only where the user trusts the writer.
    Pickle(Bytes),
    /// MDS `ndarray[:DTYPE[:SHAPE]]`: values in C order, little-endian.
    NdArray {
        dtype: String,
        shape: Vec<u64>,
        data: Bytes,
    },
    List(Vec<Value>),
    /// A struct's fields, in order.
    Struct(Vec<(String, Value)>),
    /// A map's entries, in order.
    Map(Vec<(Value, Value)>),
    /// Days since 1970-01-01.
    Date(i32),
    /// Microseconds since midnight.
    Time {
        micros: i64,
    },
    /// Microseconds since 1970-01-01T00:00; `utc`: an instant (else a wall-clock time).
    Timestamp {
        micros: i64,
        utc: bool,
    },
    /// A decimal's digits and point, e.g. `"-12.34"`.
    Decimal(String),
}

/// A sample's columns, in the dataset's order.
pub type Fields = Vec<(String, Value)>;
