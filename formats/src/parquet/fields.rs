//! A row's fields as values, as `pyarrow`'s `to_pylist` gives them.

use bytes::Bytes;
use parquet::record::{Field, Row};

use crate::{Fields, Value};

/// A row's columns as values; `utc`: the top-level columns of UTC timestamps.
pub(super) fn fields(row: Row, utc: &[String]) -> Fields {
    row.into_columns()
        .into_iter()
        .map(|(name, field)| {
            let value = match (field, utc.contains(&name)) {
                (Field::TimestampMillis(ms), true) => {
                    Value::Timestamp { micros: ms.saturating_mul(1000), utc: true }
                }
                (Field::TimestampMicros(us), true) => Value::Timestamp { micros: us, utc: true },
                (field, _) => value(field),
            };
            (name, value)
        })
        .collect()
}

/// One field as a value.
fn value(field: Field) -> Value {
    match field {
        Field::Null => Value::Null,
        Field::Bool(v) => Value::Bool(v),
        Field::Byte(v) => Value::Int(v.into()),
        Field::Short(v) => Value::Int(v.into()),
        Field::Int(v) => Value::Int(v.into()),
        Field::Long(v) => Value::Int(v),
        Field::UByte(v) => Value::UInt(v.into()),
        Field::UShort(v) => Value::UInt(v.into()),
        Field::UInt(v) => Value::UInt(v.into()),
        Field::ULong(v) => Value::UInt(v),
        Field::Float16(v) => Value::Float(v.to_f64()),
        Field::Float(v) => Value::Float(v.into()),
        Field::Double(v) => Value::Float(v),
        Field::Decimal(d) => Value::Decimal(decimal(d.data(), d.scale())),
        Field::Str(v) => Value::Str(v),
        Field::Bytes(v) => Value::Bytes(Bytes::copy_from_slice(v.data())),
        Field::Date(days) => Value::Date(days),
        Field::TimeMillis(ms) => Value::Time { micros: i64::from(ms) * 1000 },
        // Saturated: past Python's datetime range either way (which raises there).
        Field::TimeMicros(us) => Value::Time { micros: us },
        Field::TimestampMillis(ms) => Value::Timestamp { micros: ms.saturating_mul(1000), utc: false },
        Field::TimestampMicros(us) => Value::Timestamp { micros: us, utc: false },
        Field::Group(row) => Value::Struct(fields(row, &[])),
        Field::ListInternal(list) => Value::List(list.elements().iter().cloned().map(value).collect()),
        Field::MapInternal(map) => {
            Value::Map(map.entries().iter().map(|(k, v)| (value(k.clone()), value(v.clone()))).collect())
        }
    }
}

/// A decimal's digits with its point: big-endian two's complement `data`, `scale`
/// digits after the point (`"-12.34"`).
fn decimal(data: &[u8], scale: i32) -> String {
    // Sign-extended to 16 bytes; a decimal of more than 38 digits does not fit.
    let mut wide = [if data.first().is_some_and(|b| b & 0x80 != 0) { 0xff } else { 0 }; 16];
    let n = data.len().min(16);
    wide[16 - n..].copy_from_slice(&data[data.len() - n..]);
    let v = i128::from_be_bytes(wide);
    let digits = v.unsigned_abs().to_string();
    let sign = if v < 0 { "-" } else { "" };
    match usize::try_from(scale) {
        Ok(0) | Err(_) => format!("{sign}{digits}"),
        Ok(scale) => {
            let digits = format!("{digits:0>width$}", width = scale + 1);
            let (int, frac) = digits.split_at(digits.len() - scale);
            format!("{sign}{int}.{frac}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_keep_their_sign_and_scale() {
        assert_eq!(decimal(&(-1234i32).to_be_bytes(), 2), "-12.34");
        assert_eq!(decimal(&5i64.to_be_bytes(), 3), "0.005");
        assert_eq!(decimal(&[0x00, 0xff], 0), "255");
        assert_eq!(decimal(&[0xff], 1), "-0.1");
    }
}
