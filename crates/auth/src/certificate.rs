//! What a client certificate says about its caller: the subject's common
//! name, which the callers file binds to a name (`cert:` lines). The
//! transport reads it from the verified chain; nothing else of the
//! certificate is used.

/// The subject common name of a DER certificate, if it has one.
pub fn common_name(der: &[u8]) -> Option<String> {
    use x509_cert::der::asn1::{PrintableStringRef, Utf8StringRef};
    use x509_cert::der::oid::ObjectIdentifier;
    use x509_cert::der::Decode;
    const CN: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");
    let cert = x509_cert::Certificate::from_der(der).ok()?;
    let subject = &cert.tbs_certificate.subject;
    subject
        .0
        .iter()
        .flat_map(|rdn| rdn.0.iter())
        .find(|atv| atv.oid == CN)
        .and_then(|atv| {
            atv.value
                .decode_as::<Utf8StringRef<'_>>()
                .map(|s| s.as_str().to_owned())
                .or_else(|_| {
                    atv.value
                        .decode_as::<PrintableStringRef<'_>>()
                        .map(|s| s.as_str().to_owned())
                })
                .ok()
        })
}
