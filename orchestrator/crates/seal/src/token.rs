//! Security tokens: the compact JWTs the gateway issues at attestation and checks on every call.
//!
//! The token binds a session to its security context (`scp`), workload (`wid`) and lifetime
//! (`exp`). The gateway signs its own tokens with Ed25519 (`alg: EdDSA`), and, because the RFC
//! says verifiers MUST support RS256 too, it also accepts RS256 tokens signed by an RSA key an
//! operator configured (for example an external IAM that mints tokens for pre-created sessions).
//! Nothing else is ever accepted: not `none`, not HMAC (an HMAC "public key" would let anyone
//! who knows it forge tokens), not algorithms we did not ask for.
//!
//! Compact JWS is implemented here directly (three Base64url segments, the signature over
//! `header.claims`) rather than through the `jsonwebtoken` crate: its pure-Rust backend pulls in
//! P-256, P-384, HMAC and PEM/ASN.1 crates we do not need, while the two algorithms we do need
//! are one call each on `ed25519-dalek` and `rsa`.
//!
//! Check order in [`TokenIssuer::verify`]: shape, header, signature, claims, then time. A token
//! whose signature fails is 1004 whatever its claims say; a correctly signed token past `exp`
//! is 1003. There is no leeway on `exp`: the gateway issued it and shares its own clock.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use rsa::pkcs1::DecodeRsaPublicKey as _;
use rsa::pkcs8::DecodePublicKey as _;
use rsa::signature::Verifier as _;
use rsa::traits::PublicKeyParts as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

use super::error::{SealCode, SealError};

/// Longest token lifetime accepted or issued (RFC §4.2.4: MUST NOT exceed 24 h).
pub const MAX_LIFETIME_SECS: i64 = 24 * 3600;

/// How far in the future `iat` may lie before a token is refused (clock skew of an external
/// RS256 issuer).
pub const IAT_LEEWAY_SECS: i64 = 60;

/// Smallest RSA modulus accepted for RS256 verification keys.
pub const MIN_RSA_BITS: usize = 2048;

/// The claims of a SEAL security token (notes §2.2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The caller (agent) id.
    pub sub: String,
    /// Issued at, Unix seconds.
    pub iat: i64,
    /// Expiry, Unix seconds; the token is refused from this second on.
    pub exp: i64,
    /// The security context name.
    pub scp: String,
    /// The workload identity (`docker://…`).
    pub wid: String,
    /// Token (session) id; empty when an external issuer left it out.
    #[serde(default)]
    pub jti: String,
    /// Execution id, when the session belongs to an execution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_id: Option<String>,
    /// Issuer; [`TokenIssuer::issue`] fills in its own when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
}

#[derive(Serialize)]
struct IssuedHeader<'a> {
    alg: &'static str,
    typ: &'static str,
    kid: &'a str,
}

#[derive(Deserialize)]
struct ReceivedHeader {
    alg: String,
    #[serde(default)]
    typ: Option<String>,
    #[serde(default)]
    crit: Option<Value>,
}

type Rs256Key = rsa::pkcs1v15::VerifyingKey<Sha256>;

/// Issues EdDSA security tokens with the gateway's key and verifies EdDSA and RS256 tokens.
#[derive(Clone)]
pub struct TokenIssuer {
    signing: SigningKey,
    verifying: VerifyingKey,
    issuer: String,
    kid: String,
    rs256: Vec<Rs256Key>,
}

impl std::fmt::Debug for TokenIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenIssuer")
            .field("issuer", &self.issuer)
            .field("kid", &self.kid)
            .field("rs256_keys", &self.rs256.len())
            .finish_non_exhaustive()
    }
}

fn token_error(message: impl Into<String>) -> SealError {
    SealError::new(SealCode::TokenVerificationFailed, message)
}

impl TokenIssuer {
    /// An issuer whose Ed25519 key is derived from `seed` (keep the seed to keep tokens valid
    /// across restarts).
    pub fn from_seed(seed: [u8; 32], issuer: &str) -> TokenIssuer {
        let signing = SigningKey::from_bytes(&seed);
        let verifying = signing.verifying_key();
        // RFC 7638 JWK thumbprint: SHA-256 of the required members in lexicographic order.
        let x = URL_SAFE_NO_PAD.encode(verifying.to_bytes());
        let thumbprint = Sha256::digest(format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#));
        TokenIssuer {
            signing,
            verifying,
            issuer: issuer.to_owned(),
            kid: URL_SAFE_NO_PAD.encode(thumbprint),
            rs256: Vec::new(),
        }
    }

    /// An issuer with a fresh random key from the operating system.
    pub fn generate(issuer: &str) -> Result<TokenIssuer, SealError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| {
            SealError::new(
                SealCode::AttestationFailed,
                format!("cannot generate the token signing key: {e}"),
            )
        })?;
        let issuer = TokenIssuer::from_seed(seed, issuer);
        seed.fill(0);
        Ok(issuer)
    }

    /// Also accept RS256 tokens signed by this RSA key (PEM: SPKI `PUBLIC KEY` or PKCS#1
    /// `RSA PUBLIC KEY`, at least 2048 bits). May be called several times (key rotation).
    pub fn with_rs256_public_key_pem(mut self, pem: &str) -> Result<TokenIssuer, SealError> {
        let key = rsa::RsaPublicKey::from_public_key_pem(pem)
            .or_else(|_| rsa::RsaPublicKey::from_pkcs1_pem(pem))
            .map_err(|e| {
                token_error(format!(
                    "cannot read the RS256 public key (expected a PEM `PUBLIC KEY` or \
                     `RSA PUBLIC KEY` block): {e}"
                ))
            })?;
        let bits = key.size() * 8;
        if bits < MIN_RSA_BITS {
            return Err(token_error(format!(
                "the RS256 public key has {bits} bits; at least {MIN_RSA_BITS} are required"
            )));
        }
        self.rs256.push(Rs256Key::new(key));
        Ok(self)
    }

    /// The issuer name put in `iss`.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The key id in issued headers: the RFC 7638 thumbprint of the Ed25519 public key.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The Ed25519 public key, standard Base64 of the raw 32 bytes.
    pub fn public_key_b64(&self) -> String {
        STANDARD.encode(self.verifying.to_bytes())
    }

    /// The Ed25519 public key as a JWK, for publishing (e.g. in a JWKS document).
    pub fn public_jwk(&self) -> Value {
        json!({
            "kty": "OKP",
            "crv": "Ed25519",
            "x": URL_SAFE_NO_PAD.encode(self.verifying.to_bytes()),
            "kid": self.kid,
            "alg": "EdDSA",
            "use": "sig",
        })
    }

    /// The secret seed, for storing the key so tokens survive a restart. Treat as a secret.
    pub fn seed_bytes(&self) -> [u8; 32] {
        self.signing.to_bytes()
    }

    /// Signs `claims` as a compact JWT with header `{"alg":"EdDSA","typ":"JWT","kid":…}`.
    /// `iss` is set to this issuer when the claims have none. Refuses (3002) claims whose
    /// lifetime is not positive or exceeds 24 h.
    pub fn issue(&self, claims: &Claims) -> Result<String, SealError> {
        let lifetime = claims.exp.saturating_sub(claims.iat);
        if lifetime <= 0 || lifetime > MAX_LIFETIME_SECS {
            return Err(SealError::new(
                SealCode::AttestationFailed,
                format!(
                    "a token lifetime of {lifetime} s is not allowed; it must be between 1 s \
                     and {MAX_LIFETIME_SECS} s"
                ),
            ));
        }
        let mut claims = claims.clone();
        if claims.iss.is_none() {
            claims.iss = Some(self.issuer.clone());
        }
        let header = IssuedHeader {
            alg: "EdDSA",
            typ: "JWT",
            kid: &self.kid,
        };
        let signing_input = format!("{}.{}", encode_segment(&header)?, encode_segment(&claims)?);
        let signature = self.signing.sign(signing_input.as_bytes());
        Ok(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature.to_bytes())
        ))
    }

    /// Verifies `token` at `now_unix`: an EdDSA token signed by this issuer's key, or an RS256
    /// token signed by a configured RSA key. Malformed tokens, bad signatures, refused
    /// algorithms, unreadable claims, lifetimes over 24 h and `iat` in the future are 1004;
    /// `now_unix >= exp` is 1003.
    pub fn verify(&self, token: &str, now_unix: i64) -> Result<Claims, SealError> {
        let claims = self.verify_signed(token)?;
        check_times(&claims, now_unix)?;
        Ok(claims)
    }

    /// The part of [`TokenIssuer::verify`] that depends on the token's bytes alone (form,
    /// algorithm, signature, readable claims): its answer for a given token never changes, so a
    /// caller may remember it; [`check_times`] must still be applied at every use.
    pub fn verify_signed(&self, token: &str) -> Result<Claims, SealError> {
        let mut parts = token.split('.');
        let (Some(header_b64), Some(claims_b64), Some(signature_b64), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(token_error(
                "the security token is not a compact JWT (three dot-separated parts)",
            ));
        };
        let decode = |segment: &str, what: &str| {
            URL_SAFE_NO_PAD.decode(segment).map_err(|e| {
                token_error(format!(
                    "the security token's {what} is not Base64url without padding ({e})"
                ))
            })
        };
        let header: ReceivedHeader = json_object(&decode(header_b64, "header")?)
            .map_err(|e| token_error(format!("the security token's header is unreadable ({e})")))?;
        if let Some(typ) = &header.typ {
            if !typ.eq_ignore_ascii_case("JWT") {
                return Err(token_error(format!(
                    "the security token's `typ` is `{typ}`; expected `JWT`"
                )));
            }
        }
        if header.crit.is_some() {
            return Err(token_error(
                "the security token has critical header extensions (`crit`) this gateway does \
                 not implement",
            ));
        }
        let signature = decode(signature_b64, "signature")?;
        let signing_input = &token.as_bytes()[..header_b64.len() + 1 + claims_b64.len()];
        let bad_signature = || token_error("the security token's signature is invalid");
        match header.alg.as_str() {
            "EdDSA" => {
                let signature = Signature::from_slice(&signature).map_err(|_| bad_signature())?;
                self.verifying
                    .verify_strict(signing_input, &signature)
                    .map_err(|_| bad_signature())?;
            }
            "RS256" => {
                if self.rs256.is_empty() {
                    return Err(token_error(
                        "RS256 security tokens are not accepted here: no RSA public key is \
                         configured",
                    ));
                }
                let signature = rsa::pkcs1v15::Signature::try_from(signature.as_slice())
                    .map_err(|_| bad_signature())?;
                if !self
                    .rs256
                    .iter()
                    .any(|key| key.verify(signing_input, &signature).is_ok())
                {
                    return Err(bad_signature());
                }
            }
            "none" => {
                return Err(token_error(
                    "unsigned security tokens (`alg: none`) are never accepted",
                ))
            }
            alg if alg.starts_with("HS") => {
                return Err(token_error(format!(
                    "HMAC-signed security tokens (`{alg}`) are never accepted"
                )))
            }
            alg => {
                return Err(token_error(format!(
                    "security token algorithm `{alg}` is not accepted; use EdDSA or RS256"
                )))
            }
        }
        json_object(&decode(claims_b64, "claims")?)
            .map_err(|e| token_error(format!("the security token's claims are unreadable ({e})")))
    }
}

/// The time rules of a verified token at `now_unix`: lifetime at most 24 h, not issued in the
/// future (beyond a small leeway), not expired.
pub fn check_times(claims: &Claims, now_unix: i64) -> Result<(), SealError> {
    let lifetime = claims.exp.saturating_sub(claims.iat);
    if lifetime > MAX_LIFETIME_SECS {
        return Err(token_error(format!(
            "the security token lives {lifetime} s; at most {MAX_LIFETIME_SECS} s are allowed"
        )));
    }
    if claims.iat > now_unix.saturating_add(IAT_LEEWAY_SECS) {
        return Err(token_error(format!(
            "the security token was issued {} s in the future",
            claims.iat.saturating_sub(now_unix)
        )));
    }
    if now_unix >= claims.exp {
        return Err(SealError::new(
            SealCode::TokenExpired,
            format!(
                "the security token expired {} s ago; attest again for a new one",
                now_unix.saturating_sub(claims.exp)
            ),
        )
        .with_details(json!({"exp": claims.exp, "now": now_unix})));
    }
    Ok(())
}

/// Decodes a JOSE segment that must be a JSON object (serde would also accept an array for a
/// struct, which no JWT may be).
fn json_object<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    let object: serde_json::Map<String, Value> = serde_json::from_slice(bytes)?;
    serde_json::from_value(Value::Object(object))
}

/// One Base64url JWS segment of a serialisable value.
fn encode_segment<T: Serialize>(value: &T) -> Result<String, SealError> {
    serde_json::to_vec(value)
        .map(|bytes| URL_SAFE_NO_PAD.encode(bytes))
        .map_err(|e| {
            SealError::new(
                SealCode::AttestationFailed,
                format!("cannot encode the security token: {e}"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsa::pkcs8::DecodePrivateKey as _;
    use rsa::signature::SignatureEncoding as _;

    const RSA_PRIVATE: &str = include_str!("testdata/rs256-test-only.key.pem");
    const RSA_PUBLIC: &str = include_str!("testdata/rs256-test-only.pub.pem");
    const RSA_PUBLIC_PKCS1: &str = include_str!("testdata/rs256-test-only.pkcs1.pub.pem");
    const RSA_OTHER_PUBLIC: &str = include_str!("testdata/rs256-other.pub.pem");

    const NOW: i64 = 1_771_338_721;

    fn claims(iat: i64, exp: i64) -> Claims {
        Claims {
            sub: "test-agent-123".into(),
            iat,
            exp,
            scp: "read-only-research".into(),
            wid: "docker://test".into(),
            jti: "session-9d8f2e1c".into(),
            exec_id: Some("0b7c5f0e-0000-4000-8000-000000000001".into()),
            iss: None,
        }
    }

    fn b64(value: &Value) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(value).unwrap())
    }

    /// `header.body` signed with `issuer`'s key: a token of any content, well signed.
    fn signed(issuer: &TokenIssuer, header: &Value, body: &Value) -> String {
        let input = format!("{}.{}", b64(header), b64(body));
        let sig = issuer.signing.sign(input.as_bytes());
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.to_bytes()))
    }

    /// Asserts that `issuer` refuses `token` as unverifiable; `case` names it in a failure.
    fn assert_unverifiable(issuer: &TokenIssuer, token: &str, case: &Value) {
        assert_eq!(
            issuer.verify(token, NOW).unwrap_err().code,
            SealCode::TokenVerificationFailed,
            "{case}"
        );
    }

    fn rs256_token(header: &Value, claims: &Value) -> String {
        let key = rsa::RsaPrivateKey::from_pkcs8_pem(RSA_PRIVATE).unwrap();
        let signer = rsa::pkcs1v15::SigningKey::<Sha256>::new(key);
        let input = format!("{}.{}", b64(header), b64(claims));
        let signature = signer.sign(input.as_bytes());
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature.to_bytes()))
    }

    #[test]
    fn eddsa_round_trip() {
        let issuer = TokenIssuer::from_seed([3u8; 32], "seal-gateway");
        let token = issuer.issue(&claims(NOW, NOW + 3600)).unwrap();
        let mut parts = token.split('.');
        let header: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts.next().unwrap()).unwrap())
                .unwrap();
        assert_eq!(
            header,
            json!({"alg": "EdDSA", "typ": "JWT", "kid": issuer.kid()})
        );
        let got = issuer.verify(&token, NOW + 10).unwrap();
        assert_eq!(got.iss.as_deref(), Some("seal-gateway"));
        assert_eq!(
            Claims {
                iss: None,
                ..got.clone()
            },
            claims(NOW, NOW + 3600)
        );
        // The same seed gives the same key (restart); another seed does not verify.
        let again = TokenIssuer::from_seed([3u8; 32], "seal-gateway");
        assert_eq!(again.public_key_b64(), issuer.public_key_b64());
        assert_eq!(again.seed_bytes(), [3u8; 32]);
        assert!(again.verify(&token, NOW).is_ok());
        let stranger = TokenIssuer::generate("seal-gateway").unwrap();
        assert_eq!(
            stranger.verify(&token, NOW).unwrap_err().code,
            SealCode::TokenVerificationFailed
        );
        assert_eq!(issuer.public_jwk()["kid"], issuer.kid());
        assert!(!format!("{issuer:?}").contains(&format!("{:?}", [3u8; 32])));
    }

    #[test]
    fn vector3_expired_token_is_1003() {
        let issuer = TokenIssuer::from_seed([9u8; 32], "seal-gateway");
        // Vector 3's claims (exp one second before iat) cannot be issued, so sign them by hand.
        let header = json!({"alg": "EdDSA", "typ": "JWT"});
        let body = json!({"sub":"test-agent-123","scp":"read-only-research","wid":"docker://test","iat":1708261921,"exp":1708261920});
        let token = signed(&issuer, &header, &body);
        let e = issuer.verify(&token, 1708261921).unwrap_err();
        assert_eq!(e.code, SealCode::TokenExpired);
        assert!(e.message.contains("expired"));

        // A normal token: valid until the second before exp, expired from exp on.
        let token = issuer.issue(&claims(NOW, NOW + 3600)).unwrap();
        assert!(issuer.verify(&token, NOW + 3599).is_ok());
        assert_eq!(
            issuer.verify(&token, NOW + 3600).unwrap_err().code,
            SealCode::TokenExpired
        );
    }

    #[test]
    fn tampered_claims_or_signature_are_1004() {
        let issuer = TokenIssuer::from_seed([4u8; 32], "g");
        let token = issuer.issue(&claims(NOW, NOW + 60)).unwrap();
        let parts: Vec<&str> = token.split('.').collect();
        let mut forged_claims = claims(NOW, NOW + 60);
        forged_claims.scp = "unrestricted".into();
        let forged = format!(
            "{}.{}.{}",
            parts[0],
            b64(&serde_json::to_value(&forged_claims).unwrap()),
            parts[2]
        );
        let expired_and_forged = format!(
            "{}.{}.{}",
            parts[0],
            b64(&serde_json::to_value(claims(NOW - 100, NOW - 50)).unwrap()),
            parts[2]
        );
        for bad in [
            forged.as_str(),
            // A forged expired token says "bad signature", not "expired".
            expired_and_forged.as_str(),
            &format!("{}.{}.{}", parts[0], parts[1], "AAAA"),
            &format!("{}.{}", parts[0], parts[1]),
            &format!("{token}.extra"),
            "",
            "...",
            "not-a-jwt",
            &format!("{}.{}.{}=", parts[0], parts[1], parts[2]),
        ] {
            let e = issuer.verify(bad, NOW).unwrap_err();
            assert_eq!(e.code, SealCode::TokenVerificationFailed, "{bad}: {e}");
        }
    }

    #[test]
    fn none_and_hmac_are_refused() {
        let issuer = TokenIssuer::from_seed([5u8; 32], "g")
            .with_rs256_public_key_pem(RSA_PUBLIC)
            .unwrap();
        let body = serde_json::to_value(claims(NOW, NOW + 60)).unwrap();
        for (alg, sig) in [
            ("none", ""),
            ("None", ""),
            ("HS256", "c2lnbmF0dXJl"),
            ("HS512", "c2lnbmF0dXJl"),
            ("ES256", "c2lnbmF0dXJl"),
        ] {
            let token = format!(
                "{}.{}.{sig}",
                b64(&json!({"alg": alg, "typ": "JWT"})),
                b64(&body)
            );
            let e = issuer.verify(&token, NOW).unwrap_err();
            assert_eq!(e.code, SealCode::TokenVerificationFailed, "{alg}");
        }
        // An HS256 token whose "secret" is our public key is still refused.
        let e = issuer
            .verify(
                &format!(
                    "{}.{}.{}",
                    b64(&json!({"alg": "HS256"})),
                    b64(&body),
                    URL_SAFE_NO_PAD.encode(issuer.verifying.to_bytes())
                ),
                NOW,
            )
            .unwrap_err();
        assert!(e.message.contains("HMAC"), "{e}");
    }

    #[test]
    fn header_checks() {
        let issuer = TokenIssuer::from_seed([6u8; 32], "g");
        let body = serde_json::to_value(claims(NOW, NOW + 60)).unwrap();
        let sign = |header: Value| signed(&issuer, &header, &body);
        assert!(issuer.verify(&sign(json!({"alg": "EdDSA"})), NOW).is_ok());
        assert!(issuer
            .verify(&sign(json!({"alg": "EdDSA", "typ": "jwt"})), NOW)
            .is_ok());
        for header in [
            json!({"alg": "EdDSA", "typ": "JOSE+JSON"}),
            json!({"alg": "EdDSA", "crit": ["exp"]}),
            json!({"typ": "JWT"}),
            json!(["EdDSA"]),
        ] {
            assert_unverifiable(&issuer, &sign(header.clone()), &header);
        }
    }

    #[test]
    fn claim_checks() {
        let issuer = TokenIssuer::from_seed([7u8; 32], "g");
        let header = json!({"alg": "EdDSA", "typ": "JWT"});
        let sign = |body: Value| signed(&issuer, &header, &body);
        // Optional claims may be absent; unknown ones are ignored.
        let minimal = json!({"sub":"a","scp":"s","wid":"w","iat":NOW,"exp":NOW + 60,"aud":["x"]});
        let got = issuer.verify(&sign(minimal), NOW).unwrap();
        assert_eq!(got.jti, "");
        assert_eq!(got.exec_id, None);
        for body in [
            json!({"sub":"a","scp":"s","iat":NOW,"exp":NOW + 60}),
            json!({"sub":"a","scp":"s","wid":"w","iat":NOW,"exp":"later"}),
            json!({"sub":"a","scp":"s","wid":"w","iat":NOW,"exp":NOW + 90_000}),
            json!({"sub":"a","scp":"s","wid":"w","iat":NOW + 120,"exp":NOW + 600}),
            json!(["a", NOW, NOW + 60, "s", "w"]),
        ] {
            assert_unverifiable(&issuer, &sign(body.clone()), &body);
        }
    }

    #[test]
    fn issue_refuses_bad_lifetimes() {
        let issuer = TokenIssuer::from_seed([8u8; 32], "g");
        for (iat, exp) in [
            (NOW, NOW),
            (NOW, NOW - 1),
            (NOW, NOW + MAX_LIFETIME_SECS + 1),
        ] {
            assert_eq!(
                issuer.issue(&claims(iat, exp)).unwrap_err().code,
                SealCode::AttestationFailed
            );
        }
        assert!(issuer.issue(&claims(NOW, NOW + MAX_LIFETIME_SECS)).is_ok());
    }

    #[test]
    fn rs256_verifies_only_with_its_configured_key() {
        let header = json!({"alg": "RS256", "typ": "JWT", "kid": "iam-1"});
        let body = serde_json::to_value(Claims {
            iss: Some("https://iam.example".into()),
            ..claims(NOW, NOW + 600)
        })
        .unwrap();
        let token = rs256_token(&header, &body);

        let plain = TokenIssuer::from_seed([1u8; 32], "g");
        let e = plain.verify(&token, NOW).unwrap_err();
        assert_eq!(e.code, SealCode::TokenVerificationFailed);
        assert!(e.message.contains("no RSA public key"), "{e}");

        let other = plain
            .clone()
            .with_rs256_public_key_pem(RSA_OTHER_PUBLIC)
            .unwrap();
        assert_eq!(
            other.verify(&token, NOW).unwrap_err().code,
            SealCode::TokenVerificationFailed
        );

        for pem in [RSA_PUBLIC, RSA_PUBLIC_PKCS1] {
            let configured = plain.clone().with_rs256_public_key_pem(pem).unwrap();
            let got = configured.verify(&token, NOW).unwrap();
            assert_eq!(got.iss.as_deref(), Some("https://iam.example"));
            assert_eq!(
                configured.verify(&token, NOW + 600).unwrap_err().code,
                SealCode::TokenExpired
            );
            // Our own EdDSA tokens still verify alongside.
            let own = configured.issue(&claims(NOW, NOW + 60)).unwrap();
            assert!(configured.verify(&own, NOW).is_ok());
        }

        // Rotation: both the old and the new key are accepted.
        let rotated = other.with_rs256_public_key_pem(RSA_PUBLIC).unwrap();
        assert!(rotated.verify(&token, NOW).is_ok());

        // A tampered RS256 token fails.
        let parts: Vec<&str> = token.split('.').collect();
        let tampered = format!(
            "{}.{}.{}",
            parts[0],
            b64(&serde_json::to_value(claims(NOW, NOW + 6000)).unwrap()),
            parts[2]
        );
        assert_eq!(
            rotated.verify(&tampered, NOW).unwrap_err().code,
            SealCode::TokenVerificationFailed
        );
    }

    #[test]
    fn bad_rsa_pem_is_refused() {
        let plain = TokenIssuer::from_seed([1u8; 32], "g");
        assert!(plain.clone().with_rs256_public_key_pem("nonsense").is_err());
        assert!(plain.with_rs256_public_key_pem(RSA_PRIVATE).is_err());
    }
}
