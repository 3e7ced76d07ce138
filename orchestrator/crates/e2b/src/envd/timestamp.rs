//! `google.protobuf.Timestamp` with its proto3 JSON form: RFC 3339 in UTC with a `Z`, and 0, 3,
//! 6 or 9 fractional digits (the canonical output; readers take any offset). The only
//! well-known type envd's protos use, so it lives here rather than in a crate of all of them.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

/// Seconds and nanoseconds since the Unix epoch, as protobuf encodes them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Message)]
pub struct Timestamp {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// Protobuf's range: years 0001 to 9999.
const MIN_SECONDS: i64 = -62_135_596_800;
const MAX_SECONDS: i64 = 253_402_300_799;

impl Timestamp {
    /// The instant `at`.
    pub fn from_datetime(at: DateTime<Utc>) -> Self {
        Timestamp {
            seconds: at.timestamp(),
            nanos: i32::try_from(at.timestamp_subsec_nanos()).unwrap_or(0),
        }
    }

    /// The instant, if within protobuf's range and with nanoseconds in 0..1e9.
    pub fn to_datetime(self) -> Option<DateTime<Utc>> {
        if !(MIN_SECONDS..=MAX_SECONDS).contains(&self.seconds) {
            return None;
        }
        let nanos = u32::try_from(self.nanos)
            .ok()
            .filter(|n| *n < 1_000_000_000)?;
        DateTime::from_timestamp(self.seconds, nanos)
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let at = self.to_datetime().ok_or_else(|| {
            serde::ser::Error::custom("timestamp outside 0001-01-01..9999-12-31 or bad nanos")
        })?;
        let digits = match self.nanos {
            0 => SecondsFormat::Secs,
            n if n % 1_000_000 == 0 => SecondsFormat::Millis,
            n if n % 1_000 == 0 => SecondsFormat::Micros,
            _ => SecondsFormat::Nanos,
        };
        s.serialize_str(&at.to_rfc3339_opts(digits, true))
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let at = DateTime::parse_from_rfc3339(&text)
            .map_err(|e| de::Error::custom(format!("not an RFC 3339 timestamp: {e}")))?;
        let stamp = Timestamp::from_datetime(at.with_timezone(&Utc));
        if stamp.to_datetime().is_none() {
            return Err(de::Error::custom(
                "timestamp outside 0001-01-01..9999-12-31",
            ));
        }
        Ok(stamp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(seconds: i64, nanos: i32) -> String {
        serde_json::to_value(Timestamp { seconds, nanos })
            .unwrap()
            .as_str()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn canonical_output_and_lenient_input() {
        assert_eq!(text(1_704_164_645, 0), "2024-01-02T03:04:05Z");
        assert_eq!(text(1_704_164_645, 500_000_000), "2024-01-02T03:04:05.500Z");
        assert_eq!(text(1_704_164_645, 1_000), "2024-01-02T03:04:05.000001Z");
        assert_eq!(text(1_704_164_645, 1), "2024-01-02T03:04:05.000000001Z");
        let read = |s: &str| serde_json::from_value::<Timestamp>(serde_json::json!(s));
        assert_eq!(
            read("2024-01-02T04:04:05+01:00").unwrap(),
            Timestamp {
                seconds: 1_704_164_645,
                nanos: 0
            }
        );
        assert!(read("2024-01-02 03:04:05").is_err());
        assert!(read("yesterday").is_err());
        assert!(serde_json::to_value(Timestamp {
            seconds: MAX_SECONDS + 1,
            nanos: 0
        })
        .is_err());
        assert!(serde_json::to_value(Timestamp {
            seconds: 0,
            nanos: -1
        })
        .is_err());
    }
}
