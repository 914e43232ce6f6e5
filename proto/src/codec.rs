//! The protobuf codec of every jobfence server: prost's, except that a
//! request that does not decode (a string field that is not UTF-8, a
//! truncated body) is INVALID_ARGUMENT with reason INVALID_REQUEST, as any
//! other bad input, instead of tonic's INTERNAL. Clients keep prost's own
//! codec: an answer that does not decode is not the caller's bad input.

use crate::{reason, ERROR_DOMAIN};
use std::collections::HashMap;
use tonic::codec::{BufferSettings, Codec as TonicCodec, DecodeBuf, Decoder as TonicDecoder};
use tonic::{Code, Status};
use tonic_prost::{ProstCodec, ProstDecoder};
use tonic_types::{ErrorDetails, StatusExt};

/// The generated servers use this codec (see build.rs).
#[derive(Debug, Clone)]
pub struct Codec<T, U>(ProstCodec<T, U>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(ProstCodec::default())
    }
}

impl<T, U> TonicCodec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as TonicCodec>::Encoder;
    type Decoder = Decoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        Decoder(self.0.decoder())
    }
}

/// Prost's decoder with decode failures reported as bad input.
#[derive(Debug, Clone)]
pub struct Decoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> TonicDecoder for Decoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| {
            if status.code() != Code::Internal {
                return status;
            }
            let mut details = ErrorDetails::new();
            details.set_error_info(reason::INVALID_REQUEST, ERROR_DOMAIN, HashMap::new());
            details.add_bad_request_violation("(message)", status.message());
            Status::with_error_details(
                crate::v1::ErrorReason::InvalidRequest.code(),
                format!("the message does not decode: {}", status.message()),
                details,
            )
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
