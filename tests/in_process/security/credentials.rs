//! Credentials that change while a coordinator with TLS runs (issue 8): a
//! revoked token stops working on the reload, a new server certificate
//! applies to new connections, and mutual TLS keeps out a client without a
//! certificate.

use super::*;

#[tokio::test]
async fn a_revoked_token_stops_working_on_reload() {
    let s = Secure::start(false).await;
    let mut w = s.worker(Some("refunds-worker")).await;
    w.enqueue(enqueue("refunds", "k1")).await.unwrap();
    s.revoke("refunds-worker");
    refused(
        w.enqueue(enqueue("refunds", "k2")).await,
        Code::Unauthenticated,
        "CREDENTIAL_INVALID",
    );
    // A broken file is refused whole; the callers in force stay.
    std::fs::write(&s.files.callers, "this is not a callers file\n").unwrap();
    assert!(s.security.reload().is_err());
    // So is an empty one (a file caught half-written would lock out all).
    std::fs::write(&s.files.callers, "# nothing yet\n").unwrap();
    assert!(s.security.reload().is_err());
    let mut shop = s.worker(Some("shop")).await;
    shop.enqueue(enqueue("refunds", "k3")).await.unwrap();
    s.stop().await;
}

/// The TLS files are reloaded without a restart (SIGHUP calls the same
/// reload): after the server's certificate is replaced by one of another
/// CA, new connections need the new CA, and a connection opened before
/// keeps working.
#[tokio::test]
async fn a_new_server_certificate_applies_to_new_connections_on_reload() {
    use jobfence_auth::pki;
    let s = Secure::start(false).await;
    let old_creds = s.creds(Some("refunds-worker"));
    let mut before = s.worker(Some("refunds-worker")).await;
    before.enqueue(enqueue("refunds", "k1")).await.unwrap();

    let other = s.files.dir.join("rotated");
    let new = pki::dev_setup(&other, &["localhost", "127.0.0.1"], &[], &[]).unwrap();
    std::fs::copy(&new.server_cert, &s.files.server_cert).unwrap();
    std::fs::copy(&new.server_key, &s.files.server_key).unwrap();
    s.security.reload().unwrap();

    // A client trusting only the old CA no longer gets through the handshake.
    let stale = old_creds
        .endpoint(format!("https://{}", s.addr))
        .unwrap()
        .connect()
        .await;
    assert!(stale.is_err(), "the old CA still verifies the server");
    // One trusting the new CA does, with the same token.
    let mut creds = s.creds(Some("refunds-worker"));
    creds.tls_ca_pem = Some(std::fs::read(&new.ca).unwrap());
    let mut after = jobfence_api::v1::job_coordinator_client::JobCoordinatorClient::new(
        s.channel(&creds).await,
    );
    after.enqueue(enqueue("refunds", "k2")).await.unwrap();
    // The connection opened before keeps its session.
    before.enqueue(enqueue("refunds", "k3")).await.unwrap();
    s.stop().await;
}

#[tokio::test]
async fn mutual_tls_keeps_out_a_client_without_a_certificate() {
    let s = Secure::start(true).await;
    // No client certificate: the handshake fails, nothing is called.
    let creds = s.creds(Some("refunds-worker"));
    let no_cert = creds
        .endpoint(format!("https://{}", s.addr))
        .unwrap()
        .connect()
        .await;
    let refused_at_handshake = match no_cert {
        Err(_) => true,
        // tonic may report the handshake failure on the first call.
        Ok(channel) => {
            let mut c = jobfence_api::v1::job_coordinator_client::JobCoordinatorClient::new(
                tonic::service::interceptor::InterceptedService::new(
                    channel,
                    creds.authorization(),
                ),
            );
            c.enqueue(enqueue("refunds", "k1")).await.is_err()
        }
    };
    assert!(refused_at_handshake);
    assert_eq!(s.counts().await.0, 0);
    // With its certificate, the certificate's name is the caller: a worker
    // of refunds, without any token.
    let mut with_cert = s.creds(None);
    with_cert.tls_client_pem = Some(s.client_cert("cert-worker"));
    let mut w = jobfence_api::v1::job_coordinator_client::JobCoordinatorClient::new(
        s.channel(&with_cert).await,
    );
    w.enqueue(enqueue("refunds", "k1")).await.unwrap();
    refused(
        w.enqueue(enqueue("payouts", "k2")).await,
        Code::PermissionDenied,
        "QUEUE_NOT_ALLOWED",
    );
    // A token beside the certificate decides who calls.
    with_cert.token = s.creds(Some("shop")).token;
    let mut shop = jobfence_api::v1::job_coordinator_client::JobCoordinatorClient::new(
        s.channel(&with_cert).await,
    );
    refused(
        shop.claim(claim("refunds")).await,
        Code::PermissionDenied,
        "ROLE_NOT_ALLOWED",
    );
    s.stop().await;
}
