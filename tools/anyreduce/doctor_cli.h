// The `doctor` subcommand's flags (tools/doctor holds the implementation).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace anyr {
namespace tool {

// Adds `doctor` to `app`; the returned function runs it after parsing (exit code).
std::function<int()> addDoctorCommand(CLI::App& app, int argc, char** argv);

}  // namespace tool
}  // namespace anyr
