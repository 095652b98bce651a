fn main() {
    eprintln!("toolwall-relay: not built yet");
    std::process::exit(2);
}
