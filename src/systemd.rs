//! systemd integration without libsystemd. To be written.
