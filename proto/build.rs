//! Generates the Rust code and the reflection descriptor set for `shardcache.v1`
//! with `protox`, a pure-Rust protobuf compiler, so no system `protoc` is needed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["shardcache/v1/shardcache.proto", "shardcache/v1/cache.proto", "shardcache/v1/local.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = protox::compile(protos, ["."])?;
    let descriptor_path = out_dir.join("shardcache_descriptor.bin");
    std::fs::write(&descriptor_path, prost::Message::encode_to_vec(&descriptors))?;
    tonic_prost_build::configure()
        // Shard bytes stay reference-counted from the read buffer to the socket.
        .bytes(".shardcache.v1.Chunk.data")
        .bytes(".shardcache.v1.LocalPiece.data")
        // Each message encoded into room reserved for all of it (`src/codec.rs`).
        .codec_path("crate::codec::SizedCodec")
        .file_descriptor_set_path(&descriptor_path)
        .skip_protoc_run()
        .compile_protos(&protos, &["."])?;
    Ok(())
}
