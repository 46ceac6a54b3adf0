//! The gRPC codec of every shardcache service: prost's (`tonic_prost`), except that a
//! message's buffer is reserved for the whole message before it is encoded.
//!
//! prost encodes field by field into tonic's `BytesMut`, which grows as it goes: a
//! `Chunk` puts its data (reserving exactly that much), and the key of the field after
//! it then finds the buffer full and moves the whole message into a new allocation. A
//! warm stream's answers were copied twice on their way to the socket (the profile:
//! 7.9% of the spoke's CPU in `BytesMut::reserve_inner` under prost's `put_u8`, beside
//! the 8.0% of the one copy tonic makes of every message; BENCHMARKS.md, spoke-bench,
//! issue 59). Reserved up front, a message is copied into the buffer once.

use std::marker::PhantomData;

use prost::Message;
use tonic::{
    Status,
    codec::{BufferSettings, Codec, EncodeBuf, Encoder},
};
use tonic_prost::{ProstCodec, ProstDecoder};

/// [`tonic_prost::ProstCodec`] with [`SizedEncoder`] (`build.rs` names it `codec_path`).
#[derive(Debug, Clone)]
pub struct SizedCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SizedCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for SizedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = SizedEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        SizedEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(BufferSettings::default())
    }
}

/// Encodes a message into room reserved for all of it first.
#[derive(Debug, Clone)]
pub struct SizedEncoder<T>(PhantomData<T>);

impl<T: Message> Encoder for SizedEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode(buf).map_err(|e| Status::internal(format!("encoding a message: {e}")))
    }
}
