//! An MDS sample's bytes as its columns' values: the sizes of its variable columns, then
//! each column in order, decoded as its encoding says (numbers, text, JSON, pickles,
//! numpy arrays with their dtype and shape in the encoding or the bytes).

use bytes::Bytes;

use super::Column;
use crate::Value;

/// Decodes one sample's bytes into its columns' values, in column order; an error says
/// what is wrong with the sample (the caller knows which file it is of).
pub fn decode(columns: &[Column], sample: &Bytes) -> Result<Vec<(String, Value)>, String> {
    let bad = |why: String| why;
    let variable = columns.iter().filter(|c| c.size.is_none()).count();
    let mut at = 4 * variable;
    if sample.len() < at {
        return Err(bad(format!("{} bytes, shorter than its {variable} sizes", sample.len())));
    }
    let mut sizes = (0..variable)
        .map(|i| u64::from(u32::from_le_bytes(sample[i * 4..i * 4 + 4].try_into().unwrap_or_default())));
    let mut out = Vec::with_capacity(columns.len());
    for column in columns {
        let size = column.size.or_else(|| sizes.next()).unwrap_or_default();
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        let data = at
            .checked_add(size)
            .and_then(|end| sample.get(at..end))
            .ok_or_else(|| bad(format!("column {} runs past the sample", column.name)))?;
        let value = value(&column.encoding, sample.slice(at..at + data.len()))
            .map_err(|why| bad(format!("column {} ({}): {why}", column.name, column.encoding)))?;
        out.push((column.name.clone(), value));
        at += size;
    }
    if at != sample.len() {
        return Err(bad(format!("{} bytes where its columns take {at}", sample.len())));
    }
    Ok(out)
}

/// A column's bytes as its encoding says.
fn value(encoding: &str, data: Bytes) -> std::result::Result<Value, String> {
    let fixed = |n: usize| -> std::result::Result<[u8; 8], String> {
        let mut out = [0u8; 8];
        if data.len() != n {
            return Err(format!("{} bytes where {n} are expected", data.len()));
        }
        out[..n].copy_from_slice(&data);
        Ok(out)
    };
    let text = || String::from_utf8(data.to_vec()).map_err(|_| "not UTF-8".to_owned());
    let word = |n: usize| fixed(n).map(u64::from_le_bytes);
    Ok(match encoding {
        "int8" => Value::Int(i64::from(word(1)? as u8 as i8)),
        "int16" => Value::Int(i64::from(word(2)? as u16 as i16)),
        "int32" => Value::Int(i64::from(word(4)? as u32 as i32)),
        "int64" | "int" => Value::Int(word(8)? as i64),
        "uint8" => Value::UInt(word(1)?),
        "uint16" => Value::UInt(word(2)?),
        "uint32" => Value::UInt(word(4)?),
        "uint64" => Value::UInt(word(8)?),
        "float16" => Value::Float(f64::from(half_to_f32(word(2)? as u16))),
        "float32" => Value::Float(f64::from(f32::from_bits(word(4)? as u32))),
        "float64" => Value::Float(f64::from_bits(word(8)?)),
        "str" | "str_decimal" => Value::Str(text()?),
        "str_int" => Value::Int(text()?.trim().parse().map_err(|_| "not an integer".to_owned())?),
        "str_float" => Value::Float(text()?.trim().parse().map_err(|_| "not a number".to_owned())?),
        "bytes" | "jpeg" | "png" => Value::Bytes(data),
        "json" => Value::Json(text()?),
        "pkl" => Value::Pickle(data),
        nd if nd == "ndarray" || nd.starts_with("ndarray:") => ndarray(nd, data)?,
        other => return Err(format!("the encoding {other:?} is not read here")),
    })
}

/// An `ndarray[:DTYPE[:D0,D1,...]]` column: a dtype code byte unless the encoding names
/// the dtype, a shape (`ndim << 2 | width` then dims of 1, 2, 4 or 8 bytes) unless it
/// names the shape, then the values.
fn ndarray(encoding: &str, data: Bytes) -> std::result::Result<Value, String> {
    let mut parts = encoding.split(':').skip(1);
    let (named_dtype, named_shape) = (parts.next(), parts.next());
    let mut at = 0usize;
    let dtype = match named_dtype {
        Some(dtype) => dtype.to_owned(),
        None => {
            let code = *data.first().ok_or("empty")?;
            at = 1;
            let name = match code {
                8 => "uint8",
                9 => "int8",
                16 => "uint16",
                17 => "int16",
                18 => "float16",
                32 => "uint32",
                33 => "int32",
                34 => "float32",
                64 => "uint64",
                65 => "int64",
                66 => "float64",
                other => return Err(format!("dtype code {other}")),
            };
            name.to_owned()
        }
    };
    let shape: Vec<u64> = match named_shape {
        Some(dims) => dims
            .split(',')
            .map(|d| d.trim().parse().map_err(|_| format!("shape {dims}")))
            .collect::<std::result::Result<_, _>>()?,
        None => {
            let head = *data.get(at).ok_or("no shape")?;
            at += 1;
            let (ndim, width) = (usize::from(head >> 2), 1usize << (head & 3));
            let mut dims = Vec::with_capacity(ndim);
            for _ in 0..ndim {
                let bytes = data.get(at..at + width).ok_or("shape cut short")?;
                // (at most 63 dims of 8 bytes: no overflow)
                let mut word = [0u8; 8];
                word[..width].copy_from_slice(bytes);
                dims.push(u64::from_le_bytes(word));
                at += width;
            }
            dims
        }
    };
    let item = crate::tokens::item_size(&dtype).ok_or_else(|| format!("dtype {dtype}"))?;
    let expected = shape.iter().try_fold(item, |n, &d| n.checked_mul(d));
    let values = data.len().checked_sub(at).ok_or("shape cut short")? as u64;
    if expected != Some(values) {
        let needs = expected.map_or_else(|| "more than 2^64".to_owned(), |e| e.to_string());
        return Err(format!("{values} bytes of values where the shape {shape:?} needs {needs}"));
    }
    Ok(Value::NdArray { dtype, shape, data: data.slice(at..) })
}

/// An IEEE half-precision value as f32.
fn half_to_f32(h: u16) -> f32 {
    let (sign, exp, frac) = (u32::from(h >> 15), u32::from((h >> 10) & 0x1f), u32::from(h & 0x3ff));
    let bits = match (exp, frac) {
        (0, 0) => sign << 31,
        (0, _) => {
            // Subnormal: normalise.
            let shift = frac.leading_zeros() - 21;
            ((sign << 31) | ((127 - 15 + 1 - shift) << 23)) | ((frac << shift) & 0x3ff) << 13
        }
        (0x1f, _) => (sign << 31) | (0xff << 23) | (frac << 13),
        _ => (sign << 31) | ((exp + 127 - 15) << 23) | (frac << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_decodes_column_by_column() {
        // {"blob": bytes, "id": int, "text": str, "tokens": ndarray:int32} as MDSWriter
        // writes {blob: b"\x00\x01", id: 0, text: "hello", tokens: [1, 2, 3]}.
        let columns = [
            ("blob", "bytes", None),
            ("id", "int", Some(8)),
            ("text", "str", None),
            ("tokens", "ndarray:int32", None),
        ]
        .map(|(n, e, s)| Column { name: n.into(), encoding: e.into(), size: s });
        let mut sample = Vec::new();
        for size in [2u32, 5, 14] {
            sample.extend_from_slice(&size.to_le_bytes());
        }
        sample.extend_from_slice(&[0, 1]);
        sample.extend_from_slice(&0i64.to_le_bytes());
        sample.extend_from_slice(b"hello");
        sample.extend_from_slice(&[4, 3]);
        for v in [1i32, 2, 3] {
            sample.extend_from_slice(&v.to_le_bytes());
        }
        let values = decode(&columns, &Bytes::from(sample)).unwrap();
        assert_eq!(values[0].1, Value::Bytes(Bytes::from_static(&[0, 1])));
        assert_eq!(values[1].1, Value::Int(0));
        assert_eq!(values[2].1, Value::Str("hello".into()));
        let Value::NdArray { dtype, shape, data } = &values[3].1 else { panic!("{values:?}") };
        assert_eq!((dtype.as_str(), shape.as_slice(), data.len()), ("int32", &[3u64][..], 12));
        assert!(decode(&columns, &Bytes::from_static(&[9, 0, 0, 0])).is_err(), "cut short");
    }

    #[test]
    fn fixed_columns_that_do_not_fill_the_sample_are_refused() {
        let columns = [Column { name: "id".into(), encoding: "int".into(), size: Some(8) }];
        assert!(decode(&columns, &Bytes::from(vec![0u8; 8])).is_ok());
        let err = decode(&columns, &Bytes::from(vec![0u8; 12])).unwrap_err();
        assert!(err.to_string().contains("12 bytes where its columns take 8"), "{err}");
        // An ndarray whose shape's product wraps past 2^64.
        let columns =
            [Column { name: "a".into(), encoding: "ndarray:uint8:4294967296,4294967296".into(), size: None }];
        let mut sample = 0u32.to_le_bytes().to_vec();
        sample[0] = 0;
        assert!(decode(&columns, &Bytes::from(sample)).is_err());
    }

    #[test]
    fn half_precision_values() {
        assert_eq!(half_to_f32(0x3c00), 1.0);
        assert_eq!(half_to_f32(0xc000), -2.0);
        assert_eq!(half_to_f32(0x0001), 2f32.powi(-24));
        assert!(half_to_f32(0x7e00).is_nan());
    }
}
