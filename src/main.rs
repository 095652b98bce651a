fn main() {
    std::process::exit(toolwall::cli::main());
}
