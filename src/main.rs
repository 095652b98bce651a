fn main() {
    eprintln!("toolwall: skeleton");
    std::process::exit(2);
}
