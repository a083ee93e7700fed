#!/usr/bin/env python3
"""Writes host/benches/data/search-eval.json: 500 tools over 50 domains and 50 labelled queries.

Each domain has six common operations (list, get, create, update, delete, search) on its main
record, which makes domains look alike to a search engine, and four tools of its own. Queries
are worded as users ask, not as the descriptions are written.
"""
import json
import pathlib

# (prefix, system, entity, plural, what a new one needs, a list filter, [(suffix, description, {param: description})])
DOMAINS = [
    ("email", "the mailbox", "email", "emails", "recipients, subject and body", "sender or folder", [
        ("send_message", "Sends an email to one or more recipients with a subject, body and optional attachments.", {"to": "Recipient addresses", "subject": "Subject line", "body": "Message text"}),
        ("reply_to_thread", "Replies to an existing email thread, quoting the last message.", {"thread_id": "The thread", "body": "Reply text"}),
        ("mark_as_read", "Marks emails as read or unread.", {"ids": "Email ids", "read": "True to mark read"}),
        ("move_to_folder", "Moves emails into a folder such as Archive or Spam.", {"ids": "Email ids", "folder": "Target folder"})]),
    ("calendar", "the calendar", "event", "events", "title, start time, duration and attendees", "date range", [
        ("find_free_slot", "Finds the next free time slot when all given attendees are available.", {"attendees": "People who must attend", "duration_minutes": "Meeting length"}),
        ("invite_attendee", "Adds a person to an existing event and sends them an invitation.", {"event_id": "The event", "email": "Invitee address"}),
        ("set_reminder", "Sets a reminder notification before an event starts.", {"event_id": "The event", "minutes_before": "Lead time"}),
        ("decline_invitation", "Declines a meeting invitation with an optional note to the organizer.", {"event_id": "The event", "note": "Message"})]),
    ("crm", "the CRM", "contact", "contacts", "name, company and email", "company or owner", [
        ("log_call", "Logs a phone call with a contact, with notes and outcome.", {"contact_id": "The contact", "notes": "Call notes"}),
        ("create_deal", "Opens a sales deal (opportunity) for a company with an amount and stage.", {"company": "Company name", "amount": "Deal value"}),
        ("move_deal_stage", "Moves a sales deal to another pipeline stage such as negotiation or won.", {"deal_id": "The deal", "stage": "New stage"}),
        ("merge_duplicates", "Merges two duplicate contact records into one.", {"keep_id": "Record to keep", "merge_id": "Record to merge"})]),
    ("github", "GitHub", "issue", "issues", "repository, title and body", "label or state", [
        ("open_pull_request", "Opens a pull request from a branch into the base branch of a repository.", {"repo": "owner/name", "head": "Source branch", "base": "Target branch"}),
        ("merge_pull_request", "Merges an approved pull request.", {"repo": "owner/name", "number": "PR number"}),
        ("add_label", "Adds a label to an issue or pull request.", {"repo": "owner/name", "number": "Issue number", "label": "Label"}),
        ("list_commits", "Lists recent commits on a branch with author and message.", {"repo": "owner/name", "branch": "Branch"})]),
    ("jira", "Jira", "ticket", "tickets", "project, summary and type", "assignee or sprint", [
        ("transition_ticket", "Moves a Jira ticket to another workflow status like In Progress or Done.", {"key": "Ticket key", "status": "Target status"}),
        ("assign_ticket", "Assigns a Jira ticket to a team member.", {"key": "Ticket key", "assignee": "User"}),
        ("start_sprint", "Starts the next sprint on a Jira board.", {"board_id": "Board"}),
        ("log_work", "Logs time spent working on a Jira ticket.", {"key": "Ticket key", "hours": "Time spent"})]),
    ("slack", "Slack", "channel", "channels", "name and privacy", "membership", [
        ("post_message", "Posts a message to a Slack channel.", {"channel": "Channel", "text": "Message"}),
        ("send_direct_message", "Sends a private direct message to a Slack user.", {"user": "User", "text": "Message"}),
        ("add_reaction", "Adds an emoji reaction to a Slack message.", {"message_ts": "Message timestamp", "emoji": "Emoji name"}),
        ("set_status", "Sets your Slack status text and emoji.", {"text": "Status text", "emoji": "Emoji"})]),
    ("weather", "the weather service", "station", "stations", "location", "region", [
        ("current_conditions", "Returns current temperature, wind and precipitation for a city.", {"city": "City name"}),
        ("forecast", "Returns the hourly and daily weather forecast for the next days for a location.", {"city": "City name", "days": "Days ahead"}),
        ("air_quality", "Returns the air quality index and pollutant levels for a location.", {"city": "City name"}),
        ("severe_alerts", "Lists active severe weather warnings such as storms or floods for a region.", {"region": "Region"})]),
    ("stocks", "the market data feed", "watchlist", "watchlists", "name and symbols", "owner", [
        ("quote", "Returns the latest share price and daily change for a stock ticker.", {"symbol": "Ticker symbol"}),
        ("price_history", "Returns historical daily closing prices for a ticker over a date range.", {"symbol": "Ticker", "from": "Start date"}),
        ("company_financials", "Returns revenue, earnings and balance sheet figures of a listed company.", {"symbol": "Ticker"}),
        ("dividends", "Lists past and upcoming dividend payments of a stock.", {"symbol": "Ticker"})]),
    ("crypto", "the crypto exchange", "wallet", "wallets", "currency and label", "currency", [
        ("coin_price", "Returns the current price of a cryptocurrency such as bitcoin in a fiat currency.", {"coin": "Coin", "currency": "Fiat currency"}),
        ("place_order", "Places a buy or sell order for a cryptocurrency on the exchange.", {"pair": "Trading pair", "side": "buy or sell", "amount": "Amount"}),
        ("wallet_balance", "Returns the balance of each coin held in a wallet.", {"wallet_id": "Wallet"}),
        ("transfer_coins", "Transfers coins from a wallet to an external address.", {"wallet_id": "Wallet", "address": "Destination", "amount": "Amount"})]),
    ("maps", "the maps service", "saved place", "saved places", "name and coordinates", "category", [
        ("geocode", "Converts a street address into latitude and longitude coordinates.", {"address": "Street address"}),
        ("directions", "Returns driving, walking or transit directions between two places with travel time.", {"origin": "Start", "destination": "End", "mode": "Travel mode"}),
        ("nearby_places", "Finds nearby places of a type, like restaurants or pharmacies, around a location.", {"location": "Center", "type": "Place type"}),
        ("distance_matrix", "Computes travel distances and times between several origins and destinations.", {"origins": "Start points", "destinations": "End points"})]),
    ("flights", "the airline booking system", "booking", "bookings", "passengers and flight", "status", [
        ("search_flights", "Searches flights between two airports on a date, with prices.", {"from": "Origin airport", "to": "Destination airport", "date": "Departure date"}),
        ("flight_status", "Returns the live status, gate and delay of a flight by its number.", {"flight_number": "Flight number"}),
        ("check_in", "Checks a passenger in for a flight and returns the boarding pass.", {"booking_id": "Booking"}),
        ("select_seat", "Chooses a seat on a booked flight.", {"booking_id": "Booking", "seat": "Seat"})]),
    ("hotels", "the hotel booking system", "reservation", "reservations", "hotel, dates and guests", "city", [
        ("search_hotels", "Searches hotels in a city with availability and nightly prices for given dates.", {"city": "City", "check_in": "Arrival", "check_out": "Departure"}),
        ("room_availability", "Lists available room types at a hotel for given dates.", {"hotel_id": "Hotel", "check_in": "Arrival"}),
        ("cancel_reservation", "Cancels a hotel reservation and reports the refund.", {"reservation_id": "Reservation"}),
        ("hotel_reviews", "Returns guest reviews and ratings of a hotel.", {"hotel_id": "Hotel"})]),
    ("payments", "the payment processor", "payment", "payments", "amount, currency and customer", "status", [
        ("refund_payment", "Refunds a payment in full or in part.", {"payment_id": "Payment", "amount": "Amount to refund"}),
        ("create_payment_link", "Creates a shareable link where a customer can pay an amount.", {"amount": "Amount", "currency": "Currency"}),
        ("dispute_details", "Returns the details and evidence deadline of a chargeback dispute.", {"dispute_id": "Dispute"}),
        ("payout_schedule", "Returns upcoming payouts to the merchant's bank account.", {})]),
    ("invoices", "the invoicing system", "invoice", "invoices", "customer, line items and due date", "status or customer", [
        ("send_invoice", "Emails an invoice to the customer.", {"invoice_id": "Invoice"}),
        ("mark_paid", "Marks an invoice as paid with the payment date.", {"invoice_id": "Invoice", "paid_on": "Date"}),
        ("overdue_report", "Lists unpaid invoices past their due date with amounts owed.", {}),
        ("apply_credit_note", "Applies a credit note to reduce the amount of an invoice.", {"invoice_id": "Invoice", "amount": "Credit"})]),
    ("hr", "the HR system", "employee", "employees", "name, role and start date", "department", [
        ("request_time_off", "Submits a vacation or sick leave request for dates.", {"employee_id": "Employee", "from": "First day", "to": "Last day"}),
        ("leave_balance", "Returns how many vacation days an employee has left.", {"employee_id": "Employee"}),
        ("org_chart", "Returns the reporting line: manager and direct reports of an employee.", {"employee_id": "Employee"}),
        ("payslip", "Returns an employee's payslip for a month.", {"employee_id": "Employee", "month": "Month"})]),
    ("recruiting", "the applicant tracking system", "candidate", "candidates", "name, role and resume", "job or stage", [
        ("schedule_interview", "Schedules an interview between a candidate and interviewers.", {"candidate_id": "Candidate", "time": "Time"}),
        ("post_job", "Publishes a job opening on the careers page and job boards.", {"title": "Job title", "description": "Job description"}),
        ("submit_feedback", "Records an interviewer's scorecard and hire recommendation for a candidate.", {"candidate_id": "Candidate", "rating": "Score"}),
        ("send_offer", "Sends an offer letter with salary to a candidate.", {"candidate_id": "Candidate", "salary": "Salary"})]),
    ("analytics", "the web analytics service", "dashboard", "dashboards", "name and widgets", "owner", [
        ("page_views", "Returns page views and unique visitors of a website for a period.", {"site": "Site", "from": "Start", "to": "End"}),
        ("top_referrers", "Lists the sites that send the most traffic.", {"site": "Site"}),
        ("conversion_funnel", "Returns conversion rates at each step of a funnel such as signup to purchase.", {"funnel_id": "Funnel"}),
        ("realtime_visitors", "Returns how many people are on the website right now.", {"site": "Site"})]),
    ("database", "the SQL database", "table", "tables", "columns and types", "schema", [
        ("run_query", "Runs a read-only SQL query and returns the rows.", {"sql": "SQL statement"}),
        ("explain_query", "Shows the execution plan of a SQL query to diagnose slowness.", {"sql": "SQL statement"}),
        ("table_schema", "Returns the columns, types and indexes of a table.", {"table": "Table name"}),
        ("backup_database", "Takes a snapshot backup of the database.", {})]),
    ("files", "cloud storage", "file", "files", "name, folder and content", "folder", [
        ("upload_file", "Uploads a file to a folder in cloud storage.", {"path": "Destination path", "content": "File content"}),
        ("share_file", "Shares a file with people by email with view or edit access.", {"file_id": "File", "email": "Person", "role": "viewer or editor"}),
        ("download_link", "Creates a temporary download link for a file.", {"file_id": "File"}),
        ("storage_usage", "Returns how much storage space is used and left.", {})]),
    ("images", "the image service", "image", "images", "source and title", "album", [
        ("resize_image", "Resizes an image to a width and height.", {"image_id": "Image", "width": "Width", "height": "Height"}),
        ("remove_background", "Removes the background of a photo, leaving the subject on transparency.", {"image_id": "Image"}),
        ("generate_image", "Generates a new image from a text prompt.", {"prompt": "What to draw"}),
        ("describe_image", "Describes what is in a picture and lists detected objects.", {"image_id": "Image"})]),
    ("pdf", "the document service", "document", "documents", "file", "folder", [
        ("extract_text", "Extracts the text content of a PDF file.", {"document_id": "Document"}),
        ("merge_pdfs", "Combines several PDF files into one.", {"document_ids": "Documents in order"}),
        ("sign_document", "Requests electronic signatures on a PDF from signers.", {"document_id": "Document", "signers": "Signer emails"}),
        ("fill_form", "Fills the fields of a PDF form.", {"document_id": "Document", "fields": "Field values"})]),
    ("translate", "the translation service", "glossary", "glossaries", "terms", "language", [
        ("translate_text", "Translates text from one language to another.", {"text": "Text", "target_language": "Target language"}),
        ("detect_language", "Detects which language a text is written in.", {"text": "Text"}),
        ("translate_document", "Translates a whole document file keeping its layout.", {"document_id": "Document", "target_language": "Target language"}),
        ("supported_languages", "Lists the languages the service can translate between.", {})]),
    ("sheets", "the spreadsheet", "sheet", "sheets", "name and columns", "workbook", [
        ("append_row", "Appends a row of values to the end of a spreadsheet.", {"sheet_id": "Sheet", "values": "Cell values"}),
        ("read_range", "Reads the cell values in a range like A1:C10.", {"sheet_id": "Sheet", "range": "A1 range"}),
        ("write_cells", "Writes values into cells of a spreadsheet range.", {"sheet_id": "Sheet", "range": "A1 range", "values": "Values"}),
        ("create_chart", "Adds a chart built from a range of cells.", {"sheet_id": "Sheet", "range": "Data range", "type": "Chart type"})]),
    ("docs", "the document editor", "doc", "docs", "title and content", "folder", [
        ("append_paragraph", "Appends a paragraph of text to a document.", {"doc_id": "Document", "text": "Text"}),
        ("add_comment", "Adds a comment on a passage of a document.", {"doc_id": "Document", "text": "Comment"}),
        ("export_document", "Exports a document as PDF, DOCX or Markdown.", {"doc_id": "Document", "format": "Format"}),
        ("suggest_edits", "Proposes tracked-change edits to a document.", {"doc_id": "Document", "edits": "Edits"})]),
    ("shop", "the online store", "product", "products", "title, price and stock", "collection", [
        ("create_order", "Places an order for products on behalf of a customer.", {"customer_id": "Customer", "items": "Products and quantities"}),
        ("apply_discount", "Creates a discount code for a percentage or amount off.", {"code": "Code", "percent_off": "Percent"}),
        ("abandoned_carts", "Lists shopping carts customers left without checking out.", {}),
        ("sales_report", "Returns total sales, orders and average order value for a period.", {"from": "Start", "to": "End"})]),
    ("shipping", "the shipping carrier", "shipment", "shipments", "sender, recipient and parcel", "status", [
        ("track_package", "Returns the tracking history and estimated delivery date of a package.", {"tracking_number": "Tracking number"}),
        ("shipping_rates", "Compares shipping rates and delivery times across carriers for a parcel.", {"weight_kg": "Weight", "to_postcode": "Destination"}),
        ("print_label", "Creates a shipping label PDF for a shipment.", {"shipment_id": "Shipment"}),
        ("schedule_pickup", "Books a courier pickup at an address.", {"address": "Pickup address", "date": "Date"})]),
    ("inventory", "the warehouse system", "item", "items", "SKU, name and quantity", "warehouse", [
        ("adjust_stock", "Adjusts the stock level of an item after a count or damage.", {"sku": "SKU", "delta": "Change"}),
        ("low_stock", "Lists items whose stock is below their reorder point.", {}),
        ("create_purchase_order", "Creates a purchase order to restock items from a supplier.", {"supplier": "Supplier", "items": "Items and quantities"}),
        ("transfer_stock", "Moves stock between two warehouses.", {"sku": "SKU", "from": "Source", "to": "Destination"})]),
    ("support", "the helpdesk", "ticket", "tickets", "requester, subject and description", "status or priority", [
        ("reply_to_customer", "Sends a reply to the customer on a support ticket.", {"ticket_id": "Ticket", "body": "Reply"}),
        ("escalate_ticket", "Escalates a support ticket to a higher tier or raises its priority.", {"ticket_id": "Ticket"}),
        ("csat_scores", "Returns customer satisfaction survey scores for a period.", {}),
        ("suggest_article", "Suggests help center articles that answer a customer's question.", {"question": "Question"})]),
    ("monitoring", "the monitoring system", "alert rule", "alert rules", "metric, threshold and channel", "service", [
        ("acknowledge_incident", "Acknowledges an on-call incident so escalation stops.", {"incident_id": "Incident"}),
        ("metric_query", "Returns a time series of a metric like CPU or latency for a service.", {"metric": "Metric", "service": "Service"}),
        ("uptime", "Returns the uptime percentage of a service over a period.", {"service": "Service"}),
        ("who_is_on_call", "Returns who is on call right now for a team.", {"team": "Team"})]),
    ("logs", "the log platform", "saved search", "saved searches", "query", "owner", [
        ("search_logs", "Searches application logs for matching lines in a time range.", {"query": "Query", "from": "Start"}),
        ("tail_logs", "Streams the latest log lines of a service.", {"service": "Service"}),
        ("error_summary", "Groups recent errors by message and counts them.", {"service": "Service"}),
        ("set_retention", "Changes how many days logs are kept.", {"days": "Days"})]),
    ("dns", "the DNS provider", "record", "records", "type, name and value", "zone", [
        ("lookup", "Resolves a domain name to its A, AAAA, MX or TXT records.", {"domain": "Domain", "type": "Record type"}),
        ("register_domain", "Registers a new domain name.", {"domain": "Domain"}),
        ("renew_certificate", "Renews the TLS certificate of a domain.", {"domain": "Domain"}),
        ("whois", "Returns registration details and expiry date of a domain.", {"domain": "Domain"})]),
    ("k8s", "the Kubernetes cluster", "deployment", "deployments", "image and replicas", "namespace", [
        ("scale_deployment", "Changes the number of replicas of a deployment.", {"name": "Deployment", "replicas": "Replica count"}),
        ("pod_logs", "Returns the logs of a pod's container.", {"pod": "Pod"}),
        ("rollout_restart", "Restarts all pods of a deployment with a rolling update.", {"name": "Deployment"}),
        ("describe_pod", "Shows the status, events and restarts of a pod.", {"pod": "Pod"})]),
    ("cloud", "the cloud provider", "virtual machine", "virtual machines", "size, image and region", "region", [
        ("start_instance", "Starts a stopped virtual machine.", {"instance_id": "Instance"}),
        ("stop_instance", "Stops a running virtual machine.", {"instance_id": "Instance"}),
        ("cost_report", "Returns cloud spending by service for the month.", {"month": "Month"}),
        ("create_snapshot", "Takes a disk snapshot of a virtual machine.", {"instance_id": "Instance"})]),
    ("marketing", "the email marketing tool", "campaign", "campaigns", "audience, subject and content", "status", [
        ("send_campaign", "Sends a newsletter campaign to its audience now or at a time.", {"campaign_id": "Campaign"}),
        ("campaign_stats", "Returns open and click rates of a sent campaign.", {"campaign_id": "Campaign"}),
        ("add_subscriber", "Adds an email address to a mailing list.", {"list_id": "List", "email": "Address"}),
        ("unsubscribe", "Removes an address from all mailing lists.", {"email": "Address"})]),
    ("social", "the social media manager", "post", "posts", "text, media and networks", "network", [
        ("schedule_post", "Schedules a social media post for a date and time.", {"text": "Post text", "at": "Time"}),
        ("mentions", "Lists recent mentions of the brand on social networks.", {}),
        ("follower_growth", "Returns follower counts over time per network.", {}),
        ("reply_to_comment", "Replies to a comment on a post.", {"comment_id": "Comment", "text": "Reply"})]),
    ("news", "the news service", "topic subscription", "topic subscriptions", "topic", "topic", [
        ("headlines", "Returns today's top headlines, optionally for a country or category.", {"country": "Country", "category": "Category"}),
        ("search_articles", "Searches news articles about a subject.", {"query": "Subject"}),
        ("summarize_article", "Summarizes a news article from its URL.", {"url": "Article URL"}),
        ("trending_topics", "Lists topics trending in the news.", {})]),
    ("sports", "the sports data service", "favorite team", "favorite teams", "team", "league", [
        ("live_scores", "Returns live scores of games in progress.", {"league": "League"}),
        ("standings", "Returns the league table with points.", {"league": "League"}),
        ("fixtures", "Lists a team's upcoming matches with dates.", {"team": "Team"}),
        ("player_stats", "Returns a player's season statistics.", {"player": "Player"})]),
    ("recipes", "the recipe service", "recipe", "recipes", "ingredients and steps", "cuisine", [
        ("find_by_ingredients", "Finds recipes that use the ingredients you have.", {"ingredients": "Ingredients"}),
        ("nutrition_facts", "Returns calories and nutrients of a recipe or food.", {"food": "Food"}),
        ("meal_plan", "Plans meals for a week within a calorie target.", {"calories": "Daily calories"}),
        ("shopping_list", "Builds a grocery shopping list from chosen recipes.", {"recipe_ids": "Recipes"})]),
    ("health", "the patient portal", "appointment", "appointments", "doctor, time and reason", "doctor", [
        ("book_appointment", "Books a doctor appointment at an open time.", {"doctor_id": "Doctor", "time": "Time"}),
        ("prescription_refill", "Requests a refill of a medication prescription.", {"prescription_id": "Prescription"}),
        ("lab_results", "Returns recent lab test results.", {}),
        ("symptom_checker", "Suggests possible causes and urgency for symptoms.", {"symptoms": "Symptoms"})]),
    ("fitness", "the fitness tracker", "workout", "workouts", "type, duration and distance", "type", [
        ("daily_steps", "Returns steps walked per day.", {"from": "Start"}),
        ("sleep_summary", "Returns sleep duration and quality for recent nights.", {}),
        ("heart_rate", "Returns heart rate readings and resting heart rate.", {}),
        ("training_plan", "Creates a running training plan toward a race goal.", {"goal": "Race and time"})]),
    ("music", "the music streaming service", "playlist", "playlists", "name and tracks", "owner", [
        ("play_track", "Plays a song on the user's active device.", {"track": "Song"}),
        ("add_to_playlist", "Adds songs to a playlist.", {"playlist_id": "Playlist", "tracks": "Songs"}),
        ("recommend_tracks", "Recommends songs similar to given songs or artists.", {"seed": "Songs or artists"}),
        ("lyrics", "Returns the lyrics of a song.", {"track": "Song"})]),
    ("video", "the video platform", "video", "videos", "title, file and description", "channel", [
        ("upload_video", "Uploads a video with title and description.", {"file": "Video file", "title": "Title"}),
        ("video_analytics", "Returns views, watch time and likes of a video.", {"video_id": "Video"}),
        ("generate_captions", "Generates subtitles for a video from its audio.", {"video_id": "Video"}),
        ("trim_video", "Cuts a video to a start and end time.", {"video_id": "Video", "start": "Start", "end": "End"})]),
    ("learning", "the learning platform", "course", "courses", "title and lessons", "subject", [
        ("enroll_student", "Enrolls a student in a course.", {"course_id": "Course", "student_id": "Student"}),
        ("grade_assignment", "Grades a student's assignment with feedback.", {"submission_id": "Submission", "grade": "Grade"}),
        ("create_quiz", "Creates a quiz with questions for a lesson.", {"lesson_id": "Lesson", "questions": "Questions"}),
        ("student_progress", "Returns a student's completion and scores across a course.", {"student_id": "Student"})]),
    ("legal", "the contract management system", "contract", "contracts", "parties, terms and dates", "counterparty", [
        ("review_contract", "Reviews a contract and flags risky clauses.", {"contract_id": "Contract"}),
        ("renewal_dates", "Lists contracts expiring or renewing soon.", {}),
        ("draft_nda", "Drafts a non-disclosure agreement between two parties.", {"party_a": "First party", "party_b": "Second party"}),
        ("compare_versions", "Shows the differences between two versions of a contract.", {"contract_id": "Contract"})]),
    ("realestate", "the property listing service", "listing", "listings", "address, price and photos", "city", [
        ("search_homes", "Searches homes for sale by city, price range and bedrooms.", {"city": "City", "max_price": "Budget", "bedrooms": "Bedrooms"}),
        ("estimate_value", "Estimates the market value of a property.", {"address": "Address"}),
        ("mortgage_calculator", "Calculates monthly mortgage payments from price, rate and term.", {"price": "Price", "rate": "Interest rate", "years": "Term"}),
        ("book_viewing", "Books a viewing of a property.", {"listing_id": "Listing", "time": "Time"})]),
    ("smarthome", "the smart home hub", "device", "devices", "name, type and room", "room", [
        ("set_thermostat", "Sets the target temperature of the thermostat.", {"temperature": "Degrees"}),
        ("toggle_lights", "Turns lights on or off in a room.", {"room": "Room", "on": "On or off"}),
        ("lock_door", "Locks or unlocks a smart door lock.", {"door": "Door", "locked": "Lock state"}),
        ("energy_usage", "Returns the home's electricity consumption.", {})]),
    ("security", "the security scanner", "scan", "scans", "target and profile", "severity", [
        ("scan_dependencies", "Scans a project's dependencies for known vulnerabilities (CVEs).", {"repo": "Repository"}),
        ("check_password_breach", "Checks whether a password appears in known data breaches.", {"password_hash_prefix": "SHA-1 prefix"}),
        ("rotate_secret", "Rotates an API key or secret and updates its consumers.", {"secret_id": "Secret"}),
        ("audit_log", "Returns who did what and when in the account.", {})]),
    ("notes", "the notes app", "note", "notes", "title and text", "notebook", [
        ("pin_note", "Pins a note to the top.", {"note_id": "Note"}),
        ("add_todo", "Adds a to-do item with an optional due date.", {"text": "Task", "due": "Due date"}),
        ("complete_todo", "Marks a to-do item as done.", {"todo_id": "To-do"}),
        ("summarize_notes", "Summarizes the notes in a notebook.", {"notebook": "Notebook"})]),
    ("currency", "the exchange rate service", "rate alert", "rate alerts", "pair and threshold", "pair", [
        ("convert_currency", "Converts an amount of money from one currency to another at today's rate.", {"amount": "Amount", "from": "From currency", "to": "To currency"}),
        ("historical_rate", "Returns the exchange rate between two currencies on a past date.", {"from": "From", "to": "To", "date": "Date"}),
        ("rate_trend", "Returns how an exchange rate moved over a period.", {"from": "From", "to": "To"}),
        ("list_currencies", "Lists supported currency codes and names.", {})]),
    ("units", "the unit converter", "custom unit", "custom units", "name and factor", "kind", [
        ("convert_length", "Converts lengths between metric and imperial units like km, miles, feet and meters.", {"value": "Value", "from": "Unit", "to": "Unit"}),
        ("convert_temperature", "Converts temperatures between Celsius, Fahrenheit and Kelvin.", {"value": "Value", "from": "Scale", "to": "Scale"}),
        ("convert_weight", "Converts weights between kilograms, pounds, ounces and grams.", {"value": "Value", "from": "Unit", "to": "Unit"}),
        ("convert_volume", "Converts volumes between liters, gallons, cups and milliliters.", {"value": "Value", "from": "Unit", "to": "Unit"})]),
]

GENERIC = [
    ("list_{plural_}", "Lists {plural} in {system}, newest first, optionally filtered by {filter}.", {"filter": "Optional filter", "limit": "Maximum results"}),
    ("get_{entity_}", "Fetches one {entity} from {system} by its id, with all its fields.", {"id": "The {entity} id"}),
    ("create_{entity_}", "Creates a new {entity} in {system} from {fields}.", {"fields": "The new {entity}'s {fields}"}),
    ("update_{entity_}", "Updates fields of an existing {entity} in {system}.", {"id": "The {entity} id", "fields": "Fields to change"}),
    ("delete_{entity_}", "Deletes a {entity} from {system}; this cannot be undone.", {"id": "The {entity} id"}),
    ("search_{plural_}", "Searches {plural} in {system} by keywords.", {"query": "Keywords"}),
]

QUERIES = [
    ("write an email to alice@example.com saying the report is ready", "email_send_message"),
    ("when are Bob, Carol and I all free for an hour next week", "calendar_find_free_slot"),
    ("record that I phoned the customer and they want a demo", "crm_log_call"),
    ("open a PR from my feature branch into main", "github_open_pull_request"),
    ("move PROJ-42 to done", "jira_transition_ticket"),
    ("post 'deploy finished' in the #ops channel", "slack_post_message"),
    ("will it rain in Paris over the weekend", "weather_forecast"),
    ("what is Apple trading at right now", "stocks_quote"),
    ("how much is one bitcoin in euros", "crypto_coin_price"),
    ("how do I get from the station to the museum on foot", "maps_directions"),
    ("is flight LH400 delayed", "flights_flight_status"),
    ("find me a hotel in Rome from June 3 to June 6", "hotels_search_hotels"),
    ("give the customer their money back for order 1234", "payments_refund_payment"),
    ("which customers still owe us money past the due date", "invoices_overdue_report"),
    ("how many vacation days do I have left", "hr_leave_balance"),
    ("set up an interview with the candidate for Tuesday", "recruiting_schedule_interview"),
    ("how many people visited our website last week", "analytics_page_views"),
    ("why is this SQL query so slow", "database_explain_query"),
    ("give Dana edit access to the budget file", "files_share_file"),
    ("cut out the background from this product photo", "images_remove_background"),
    ("get the text out of this PDF", "pdf_extract_text"),
    ("translate this paragraph into Japanese", "translate_translate_text"),
    ("add a new row with today's sales to the spreadsheet", "sheets_append_row"),
    ("save this doc as a PDF", "docs_export_document"),
    ("make a 20 percent off coupon code", "shop_apply_discount"),
    ("where is my parcel with tracking number 1Z999", "shipping_track_package"),
    ("which products do we need to reorder soon", "inventory_low_stock"),
    ("this customer issue needs to go to tier two", "support_escalate_ticket"),
    ("who is the on call engineer for payments team", "monitoring_who_is_on_call"),
    ("find error lines in the api logs from the last hour", "logs_search_logs"),
    ("what are the MX records of example.org", "dns_lookup"),
    ("run 5 replicas of the web deployment", "k8s_scale_deployment"),
    ("how much did we spend on the cloud this month", "cloud_cost_report"),
    ("what was the open rate of last newsletter", "marketing_campaign_stats"),
    ("publish this tweet tomorrow at 9am", "social_schedule_post"),
    ("what's in the news today", "news_headlines"),
    ("who is top of the Premier League table", "sports_standings"),
    ("what can I cook with eggs, spinach and feta", "recipes_find_by_ingredients"),
    ("I need my blood pressure pills refilled", "health_prescription_refill"),
    ("how well did I sleep this week", "fitness_sleep_summary"),
    ("put this song on", "music_play_track"),
    ("add subtitles to my video", "video_generate_captions"),
    ("sign this student up for the algebra course", "learning_enroll_student"),
    ("write an NDA between us and Acme", "legal_draft_nda"),
    ("what would my monthly payment be on a 400k house at 5 percent over 30 years", "realestate_mortgage_calculator"),
    ("make it 21 degrees in the house", "smarthome_set_thermostat"),
    ("check our npm packages for vulnerabilities", "security_scan_dependencies"),
    ("remind me to buy milk tomorrow", "notes_add_todo"),
    ("how many dollars is 250 pounds sterling", "currency_convert_currency"),
    ("how many miles is a marathon in kilometers, convert the distance", "units_convert_length"),
]

# Written before any tuning of the ranking and never used to tune it: the bench reports them
# apart, so a gain that only fits QUERIES shows up as a gap between the two.
HELD_OUT = [
    ("archive these three messages from the newsletter sender", "email_move_to_folder"),
    ("ping me 15 minutes before the standup starts", "calendar_set_reminder"),
    ("we closed the Globex opportunity, mark it won", "crm_move_deal_stage"),
    ("ship the approved PR 118 in the backend repo", "github_merge_pull_request"),
    ("I spent three hours on PROJ-7 today", "jira_log_work"),
    ("react with a thumbs up to that message", "slack_add_reaction"),
    ("is the air safe to breathe in Delhi today", "weather_air_quality"),
    ("how much has Tesla paid out to shareholders per share", "stocks_dividends"),
    ("buy 0.5 ETH at market price", "crypto_place_order"),
    ("what are the coordinates of 10 Downing Street", "maps_geocode"),
    ("I want a window seat on my flight", "flights_select_seat"),
    ("what do guests say about the Hilton downtown", "hotels_hotel_reviews"),
    ("when does the next transfer to our bank arrive", "payments_payout_schedule"),
    ("the client paid invoice 88 yesterday", "invoices_mark_paid"),
    ("show my salary slip for March", "hr_payslip"),
    ("make an offer to the backend candidate at 120k", "recruiting_send_offer"),
    ("which sites send us the most traffic", "analytics_top_referrers"),
    ("what columns does the orders table have", "database_table_schema"),
    ("how much of our storage quota is used", "files_storage_usage"),
    ("make this picture 800 pixels wide", "images_resize_image"),
    ("combine these two PDFs into one file", "pdf_merge_pdfs"),
    ("what language is this sentence written in", "translate_detect_language"),
    ("draw a bar chart of the revenue column", "sheets_create_chart"),
    ("leave a remark on the second paragraph of the proposal", "docs_add_comment"),
    ("who left items in their basket without buying", "shop_abandoned_carts"),
    ("how much would it cost to post a 2 kg box to Berlin", "shipping_shipping_rates"),
    ("move 40 units from the Leeds warehouse to Bristol", "inventory_transfer_stock"),
    ("how happy are customers with our help desk", "support_csat_scores"),
    ("I'm on it, acknowledge the page for the outage", "monitoring_acknowledge_incident"),
    ("keep logs for 90 days only", "logs_set_retention"),
    ("who owns the domain example.net", "dns_whois"),
    ("restart all pods of the checkout deployment", "k8s_rollout_restart"),
    ("shut down the staging VM to save money", "cloud_stop_instance"),
    ("take this reader off the mailing list", "marketing_unsubscribe"),
    ("what are people saying about our brand on twitter", "social_mentions"),
    ("give me a short version of this article", "news_summarize_article"),
    ("when do Arsenal play next", "sports_fixtures"),
    ("how many calories are in this lasagna recipe", "recipes_nutrition_facts"),
    ("book a checkup with my doctor next Monday", "health_book_appointment"),
    ("how many steps did I walk yesterday", "fitness_daily_steps"),
    ("show me the words of this song", "music_lyrics"),
    ("cut the first ten seconds off the clip", "video_trim_video"),
    ("score Maria's essay homework", "learning_grade_assignment"),
    ("which agreements come up for renewal this quarter", "legal_renewal_dates"),
    ("how much is my apartment worth", "realestate_estimate_value"),
    ("switch off the kitchen lamp", "smarthome_toggle_lights"),
    ("has my password been leaked", "security_check_password_breach"),
    ("tick off the grocery task, it's done", "notes_complete_todo"),
    ("what was the euro to yen rate on new year's day 2020", "currency_historical_rate"),
    ("it's 75 Fahrenheit, what is that in Celsius", "units_convert_temperature"),
]


def schema(params):
    return {"type": "object", "properties": {k: {"type": "string", "description": v} for k, v in params.items()}}


def main():
    tools = []
    for prefix, system, entity, plural, fields, filt, specific in DOMAINS:
        words = {"system": system, "entity": entity, "plural": plural, "fields": fields, "filter": filt,
                 "entity_": entity.replace(" ", "_"), "plural_": plural.replace(" ", "_")}
        for name, description, params in GENERIC:
            tools.append({"name": f"{prefix}_{name.format(**words)}", "description": description.format(**words),
                          "parameters": schema({k: v.format(**words) for k, v in params.items()})})
        for name, description, params in specific:
            tools.append({"name": f"{prefix}_{name}", "description": description, "parameters": schema(params)})
    names = {t["name"] for t in tools}
    assert len(tools) == len(names) == 500, (len(tools), len(names))
    for query, expected in QUERIES:
        assert expected in names, expected
    for query, expected in HELD_OUT:
        assert expected in names, expected
    assert len(QUERIES) == len(HELD_OUT) == 50
    out = pathlib.Path(__file__).resolve().parent.parent / "host/benches/data/search-eval.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {"tools": tools, "queries": [{"query": q, "expected": e} for q, e in QUERIES],
            "held_out_queries": [{"query": q, "expected": e} for q, e in HELD_OUT]}
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out}: {len(tools)} tools, {len(QUERIES)} + {len(HELD_OUT)} held-out queries")


if __name__ == "__main__":
    main()
