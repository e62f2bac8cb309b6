#include "train/step_list.h"

#include <cctype>
#include <sstream>
#include <stdexcept>

namespace olmoref {

std::vector<int64_t> parse_step_list(const std::string& text, const std::string& option, const std::string& hint) {
  std::vector<int64_t> out;
  // getline drops a trailing empty item ("4,"), so the text's own last character is checked too.
  if (text.empty() || text.back() == ',')
    throw std::invalid_argument(option + " " + text + ": an empty step" + (hint.empty() ? "" : "; " + hint));
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int64_t v = -1;
    try {
      // stoll would skip leading blanks and take a '+': a step is written as digits, with a '-' at most
      if (!item.empty() && (std::isdigit(static_cast<unsigned char>(item[0])) || item[0] == '-'))
        v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size())
      throw std::invalid_argument(option + " " + text + ": '" + item + "' is not a step" +
                                  (hint.empty() ? "" : "; " + hint));
    out.push_back(v);
  }
  return out;
}

}  // namespace olmoref
