import hashlib

SECRET = "/run/secrets/smtp-password"


def send(event):
    # Read at each invocation: a rotated secret is used at once.
    with open(SECRET, "rb") as f:
        password = f.read().strip()
    # Show that the secret arrived without showing the secret.
    fingerprint = hashlib.sha256(password).hexdigest()[:8]
    to = event["new_image"]["email"]
    print(f"welcome mail to {to} sent, SMTP login with a {len(password)}-byte password (sha256 {fingerprint}...)")
